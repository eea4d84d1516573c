"""Accuracy contracts and budget scales: the budgets they give, the records and reports that
name them, and the 16-bit example kernels judged by them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from elasticbench import register_kernel
from elasticbench.harness.numerics.budgets.row_budgets import BUDGETS, budget_for
from elasticbench.harness.numerics.contract import OWN, WIDE, parse_scale
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.numerics.truth.cache import TruthStore, default_cache_dir
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import load_kernel_file
from elasticbench.harness.verify.matrix import builtin_case, expand, load_matrix
from elasticbench.harness.verify.verifier import run_verification

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "own_format16.py"
HONEST = ("own16_elastic", "own16_softmax1")
BUGS = ("own16_one_not_rescaled", "own16_no_max_shift", "own16_clamped")


def test_the_own_contract_gives_16_bit_formats_the_fp32_analysis():
    for d in ("fp16", "bf16"):
        assert budget_for(get_format(d)) == BUDGETS[d]  # the default: computed wider
        own = budget_for(get_format(d), OWN)
        assert (own.a, own.b, own.c, own.d) == (4.0, 3.0, 1.0, 1.0)
    for d in ("fp32", "fp64"):  # they compute in their own format under either contract
        assert budget_for(get_format(d), OWN) == budget_for(get_format(d), WIDE)


def test_a_scale_multiplies_every_allowance():
    fmt = get_format("fp16")
    zabs, zbar = np.array([[0.0, 2.5, 40.0]]), np.array([1.5])
    one = budget_for(fmt, OWN).allowance(zabs, zbar, 1000, fmt)
    four = budget_for(fmt, OWN, 4.0).allowance(zabs, zbar, 1000, fmt)
    assert np.allclose(four, 4 * one)
    assert one[0, 0] == pytest.approx(4 + 1.5 + np.log2(1000))


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "x2", ""])
def test_a_bad_scale_is_refused(text):
    with pytest.raises(ValueError, match="finite number > 0"):
        parse_scale(text)


@pytest.mark.parametrize("text", ["0", "-2", "nan", "four"])
def test_verify_refuses_a_bad_scale_in_one_line(cli, text):
    r = cli("verify", "--quick", "-f", "elastic", "-d", "fp32", "--budget-scale", text)
    assert r.code == 2
    assert r.err.strip().count("\n") == 0 and "--budget-scale" in r.err
    assert "Traceback" not in r.err


def test_register_kernel_checks_the_contract():
    with pytest.raises(ValueError, match="unknown accuracy contract 'fp16'"):
        register_kernel(function="elastic", backend="numpy", accuracy="fp16")
    # attention kernels may declare own too (issue 57: test_attention_own_contract.py)
    with pytest.raises(ValueError, match="unknown accuracy contract 'half'"):
        register_kernel(function="elastic_attention", backend="numpy", accuracy="half")


def test_records_name_the_contract_and_older_files_read_as_the_default():
    old = {"kernel": "k", "function": "elastic", "backend": "numpy", "dtype": "fp16",
           "shape": [2, 3], "input": "normal", "seed": 1, "passed": True,
           "budget": {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}}
    r = VerifyRecord.from_dict(old)
    assert (r.accuracy, r.budget_scale) == ("wide", 1.0)
    assert VerifyRecord.from_dict({**old, "accuracy": "own", "budget_scale": 4}).budget_scale == 4
    with pytest.raises(ValueError, match="budget_scale"):
        VerifyRecord.from_dict({**old, "budget_scale": -1})
    with pytest.raises(ValueError, match="accuracy"):
        VerifyRecord.from_dict({**old, "accuracy": "loose"})


def test_the_scale_divides_the_share_of_the_budget_used(cli, tmp_path):
    shares = {}
    for scale in ("1", "2.5"):
        out = tmp_path / f"s{scale}.json"
        r = cli("verify", "--quick", "--only", "numpy_elastic", "-d", "fp32", "--input",
                "normal", "--budget-scale", scale, "--json", str(out))
        assert r.code == 0, r.out
        records = json.loads(out.read_text())["records"]
        assert {rec["budget_scale"] for rec in records} == {float(scale)}
        assert {rec["accuracy"] for rec in records} == {"wide"}
        shares[scale] = [rec["max_budget_frac"] for rec in records]
    assert np.allclose(np.array(shares["1"]) / 2.5, shares["2.5"])
    report = cli("report", str(tmp_path / "s2.5.json"), "-F", "markdown")
    assert "| numpy_elastic | wide x2.5 |" in report.out


def test_a_resumed_run_keeps_its_budget_scale(cli, tmp_path):
    out = tmp_path / "scaled.json"
    args = ("verify", "--quick", "--only", "numpy_elastic", "-d", "fp32", "--input", "normal")
    assert cli(*args, "--budget-scale", "3", "--json", str(out)).code == 0
    r = cli(*args, "--resume", str(out))
    assert r.code == 2 and "judged at --budget-scale 3: resume it at that scale, not 1" in r.err
    assert cli(*args, "--budget-scale", "3", "--resume", str(out)).code == 0


def test_the_honest_16_bit_kernels_pass_under_their_contract_on_long_rows(cli, tmp_path):
    # past 65504 columns, with a beta beyond fp16's range: the sum must not overflow
    out = tmp_path / "long.json"
    r = cli("verify", "--kernel-file", str(EXAMPLE), "--only", "own16_elastic", "-d",
            "fp16,bf16", "--input", "coarse", "--size", "1x1048577", "--param", "tau=1",
            "--param", "beta=1e6", "--json", str(out))
    assert r.code == 0, r.out
    records = json.loads(out.read_text())["records"]
    assert len(records) == 2 and all(rec["accuracy"] == "own" for rec in records)
    assert "| own16_elastic | own |" in cli("report", str(out), "-F", "markdown").out


def test_list_names_a_kernel_files_contract(cli):
    out = cli("list", "kernels", "--kernel-file", str(EXAMPLE)).out.splitlines()
    assert any(ln.startswith("own16_elastic ") and ln.endswith("[accuracy: own]") for ln in out)
    assert not any(ln.startswith("numpy_elastic ") and "accuracy" in ln for ln in out)


def _judged(accuracy: str, names: tuple[str, ...]) -> dict[str, list[VerifyRecord]]:
    specs = [s for s in load_kernel_file(EXAMPLE) if s.name in names]
    matrix = load_matrix(builtin_case("verify-quick"))
    out: dict[str, list[VerifyRecord]] = {}
    for spec in specs:
        records: list[VerifyRecord] = []
        run_verification([replace(spec, accuracy=accuracy)],
                         expand(matrix, [spec.function], ["fp16", "bf16"]),
                         max_elements=matrix.max_elements, store=TruthStore(default_cache_dir()),
                         on_record=records.append, max_rows=matrix.max_rows)
        out[spec.name] = records
    return out


def test_16_bit_arithmetic_passes_its_own_contract_and_fails_the_default():
    own, wide = _judged(OWN, HONEST), _judged(WIDE, HONEST)
    for name in HONEST:
        assert own[name] and all(r.passed for r in own[name]), name
        assert max(r.max_budget_frac for r in own[name]) < 0.8
        # under the default contract the same outputs are a few ulps over its budgets
        failed = [r for r in wide[name] if r.failed]
        assert failed and {r.dtype for r in failed} == {"fp16", "bf16"}
        assert all(r.special_ok for r in failed)
        assert 1 < max(r.max_budget_frac for r in failed) < 4


def test_no_contract_hides_the_classic_bugs_in_16_bit_arithmetic():
    for name, records in _judged(OWN, BUGS).items():
        for dtype in ("fp16", "bf16"):
            assert any(r.failed for r in records if r.dtype == dtype), (name, dtype)
