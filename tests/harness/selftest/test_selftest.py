"""The mutation self-test: every mutant caught for its own reason; the score can fail."""

import pytest

from elasticbench.harness.kinds.attention.mutant_kernels import ATTENTION_MUTANTS
from elasticbench.harness.numerics.truth.cache import TruthStore, default_cache_dir
from elasticbench.harness.registry import get_kernel
from elasticbench.harness.selftest.mutants import MUTANTS, Mutant
from elasticbench.harness.selftest.outcomes import run_selftest
from elasticbench.harness.verify.matrix import builtin_case, load_matrix


@pytest.mark.ci  # end to end in child processes: CI runs it, make test keeps its 5 minutes
def test_selftest_command_catches_every_mutant(cli):
    # the torch kernels' share (every torch.compile variant compiled for every dtype and
    # layout: minutes on a fresh machine) runs in `make selftest`, which CI runs after this
    r = cli("selftest", "-b", "numpy,cpp")
    assert r.code == 0, r.out
    n = len(MUTANTS) + len(ATTENTION_MUTANTS)
    assert f"mutation score {n}/{n}" in r.out
    # every row mutant but the one the own contract allows, judged by its loosest budgets
    loose = sum(not m.own_allows for m in MUTANTS)
    assert f"under the own contract at budget scale 4: {loose}/{loose}" in r.out
    assert "low_precision_sum (own x4)" not in r.out and "no_max_shift (own x4)" in r.out
    assert "cpp_attention (bwd)" in r.out  # attention kernels are self-tested too
    assert "MISSED" not in r.out and "FAILS" not in r.out
    assert "numpy_symax" in r.out and "compiled_elastic" not in r.out  # -b chose them


def test_selftest_rejects_an_unknown_backend_in_one_line(cli):
    r = cli("selftest", "-b", "fortran")
    assert r.code == 2 and "unknown backend 'fortran'" in r.err and "Traceback" not in r.err


def test_each_mutant_is_caught_where_its_bug_lives():
    matrix = load_matrix(builtin_case("verify-quick"))
    # (the command above checks them under the loosest contract too)
    outcomes = {o.name: o for o in run_selftest(MUTANTS, [], matrix, TruthStore(default_cache_dir()),
                                                loosest=False)}
    assert all(o.ok for o in outcomes.values())
    assert outcomes["nan_masked"].caught_by.input == "specials"
    assert outcomes["strict_mask"].caught_by.input in {"all_zero", "relu_zeros"}
    assert outcomes["low_precision_sum"].caught_by.dtype in {"fp16", "bf16"}
    assert outcomes["input_modified"].caught_by.reason.startswith("modified its input")
    assert outcomes["zero_over_zero"].caught_by.special_ok is False
    assert outcomes["beta_not_rescaled"].caught_by.params["beta"] > 1e-10
    assert outcomes["bwd_forgets_mask"].caught_by.mode == "bwd"
    assert outcomes["bwd_offset_not_rescaled"].caught_by.mode == "bwd"
    # wrong on one path only: caught on that path
    assert outcomes["multi_block_unscaled"].caught_by.shape[1] > 65536
    assert outcomes["row_block_stale_max"].caught_by.shape[0] > 512
    assert 2 < outcomes["tau_table"].caught_by.params["tau"] < 8
    assert outcomes["packed_rows"].caught_by.layout != "packed"
    exp_band = outcomes["exp_band"].caught_by
    assert exp_band.reason.startswith("accuracy")


def test_the_loosest_contract_judges_mutants_by_its_own_budgets():
    matrix = load_matrix(builtin_case("verify-quick"))
    chosen = tuple(m for m in MUTANTS if m.spec.name in ("one_not_rescaled", "low_precision_sum"))
    outcomes = {o.name: o for o in run_selftest(chosen, [], matrix, TruthStore(default_cache_dir()))}
    assert set(outcomes) == {"one_not_rescaled", "low_precision_sum", "one_not_rescaled (own x4)"}
    loose = outcomes["one_not_rescaled (own x4)"]
    assert loose.ok and loose.loosest
    assert (loose.caught_by.accuracy, loose.caught_by.budget_scale) == ("own", 4.0)
    assert loose.caught_by.max_budget_frac > 1


def test_a_mutant_that_is_not_wrong_is_reported_missed():
    matrix = load_matrix(builtin_case("verify-quick"))
    fake = Mutant(get_kernel("numpy_elastic"), "not actually a bug")
    (o,) = run_selftest((fake,), [], matrix, TruthStore(default_cache_dir()), loosest=False)
    assert not o.ok and o.failed_cases == 0
