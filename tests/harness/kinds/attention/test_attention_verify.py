"""Attention verification: the exact reference, the budget (strict enough to fail a 1e-4
error, loose enough for correct kernels), the special values, the CLI, records, reproduce
lines and the attention mutants (docs/attention.md section 5). Tiny shapes throughout."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest
import torch

from elasticbench.attention import flash
from elasticbench.harness.functions import get_attention_function
from elasticbench.harness.kinds.attention.mutant_kernels import (
    ATTENTION_CONTROL,
    ATTENTION_MUTANTS,
    run_attention_selftest,
)
from elasticbench.harness.kinds.attention.qkv_inputs import ATTENTION_GENERATORS, generate_qkv
from elasticbench.harness.kinds.attention.scoring import check_backward, check_forward
from elasticbench.harness.kinds.attention.verify_matrix import (
    AttentionInputs,
    AttentionMatrix,
    parse_attention_size,
)
from elasticbench.harness.numerics.budgets.attention_budgets import ATTENTION_BUDGETS, Conditioning
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.numerics.truth.attention_truth import evaluate
from elasticbench.harness.records import RecordError, VerifyRecord

EA = get_attention_function("elastic_attention")
SCALE = 0.5
PARAMS = {"tau": 0.7, "beta": 0.5, "causal": 1.0}


def _case(gen="normal", dtype="fp32", shape=(1, 2, 8, 8, 4), params=PARAMS, seed=3):
    q, k, v = generate_qkv(gen, dtype, shape, seed)
    fmt = get_format(dtype)
    dout = fmt.cast(np.random.default_rng(seed).standard_normal(q.shape))
    f64 = [a.astype(np.float64) for a in (q, k, v)]
    truth = evaluate(EA, params, *f64, SCALE, dout.astype(np.float64))
    cond = Conditioning(EA, params, *f64, SCALE, truth, fmt, ATTENTION_BUDGETS[dtype])
    return q, k, v, dout, truth, cond, fmt


def _flash(q, k, v, dout, params=PARAMS):
    wd = torch.float64 if q.dtype == np.float64 else torch.float32
    t = [torch.from_numpy(a) for a in (q, k, v, dout)]
    tau, beta = (torch.full(q.shape[:2], params[n], dtype=wd) for n in ("tau", "beta"))
    out, m, den = flash.forward(*t[:3], tau, beta, SCALE, bool(params["causal"]))
    grads = flash.backward(*t[:3], out, t[3], m, den, tau, beta, SCALE, bool(params["causal"]))
    return out.numpy(), [g.numpy() for g in grads]


def test_reference_matches_an_fp64_kernel_to_rounding():
    q, k, v, dout, truth, _, _ = _case(dtype="fp64")
    out, grads = _flash(q, k, v, dout)
    np.testing.assert_allclose(out, truth.out_hi, rtol=1e-12, atol=1e-14)
    for got, want in zip(grads, (truth.dq_hi, truth.dk_hi, truth.dv_hi,
                                 truth.dp_hi[..., 0], truth.dp_hi[..., 1]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # causal query 0 sees one key; the generator gives it scores of both signs elsewhere
    assert set(truth.kind.ravel()) <= {"finite", "masked"}


def test_correct_fp32_kernel_passes_and_a_1e4_relative_error_fails():
    q, k, v, dout, truth, cond, fmt = _case()
    out, grads = _flash(q, k, v, dout)
    assert check_forward(out, truth, cond, fmt).passed
    saved = fmt.cast(np.nan_to_num(truth.out_hi)).astype(np.float64)
    ok, _ = check_backward(grads, truth, cond, EA, dout.astype(np.float64), saved, fmt)
    assert ok.passed, ok.reason
    bad = check_forward((out * (1 + 1e-4)).astype(np.float32), truth, cond, fmt)
    assert not bad.passed and bad.reason.startswith("accuracy: out")
    worse = [grads[0] * np.float32(1 + 1e-4), *grads[1:]]
    r, _ = check_backward(worse, truth, cond, EA, dout.astype(np.float64), saved, fmt)
    assert not r.passed and "dq" in r.reason
    dtau = [*grads[:3], grads[3] * (1 + 1e-4), grads[4]]
    r, checks = check_backward(dtau, truth, cond, EA, dout.astype(np.float64), saved, fmt)
    assert not r.passed and not checks["tau"].passed and checks["beta"].passed


def test_special_values_are_judged_apart_from_accuracy():
    q, k, v, dout, truth, cond, fmt = _case(gen="all_negative")
    assert truth.out_zero.all() and (truth.dq_hi == 0).all() and truth.dzero_q.all()
    out, _ = _flash(q, k, v, dout)
    assert check_forward(out, truth, cond, fmt).passed
    nan = np.full_like(out, np.nan)
    r = check_forward(nan, truth, cond, fmt)
    assert not r.passed and r.special_ok is False and "exactly 0" in r.reason
    q, k, v, dout, truth, cond, fmt = _case(gen="nan_q", params={**PARAMS, "causal": 0.0})
    i = q.shape[2] // 2
    assert np.isnan(truth.out_hi[0, 0, i]).all() and not np.isnan(truth.out_hi[0, 0, :i]).any()
    out, _ = _flash(q, k, v, dout, {**PARAMS, "causal": 0.0})
    swallowed = np.nan_to_num(out)
    r = check_forward(swallowed, truth, cond, fmt)
    assert not r.passed and "not propagated" in r.reason


def test_nan_in_v_is_acceptable_only_where_the_key_has_no_weight():
    q, k, v, dout, truth, cond, fmt = _case(gen="nan_v", shape=(2, 2, 6, 6, 4))
    out, _ = _flash(q, k, v, dout)
    assert check_forward(out, truth, cond, fmt).passed
    assert truth.out_nan_ok.any() or np.isnan(truth.out_hi).any()


def test_every_attention_generator_is_reproducible_and_exact_in_its_format():
    for name in ATTENTION_GENERATORS:
        a = generate_qkv(name, "bf16", (1, 2, 5, 7, 4), 1)
        b = generate_qkv(name, "bf16", (1, 2, 5, 7, 4), 1)
        for x, y in zip(a, b, strict=True):
            assert x.dtype == get_format("bf16").numpy
            np.testing.assert_array_equal(x.view(np.uint16), y.view(np.uint16))
    with pytest.raises(ValueError, match="BxHxLQxLKxD"):
        parse_attention_size("2x16")


def test_attention_mutants_are_caught_and_the_correct_kernels_pass():
    matrix = AttentionMatrix("tiny", 5, ("fp32",), {"elastic_attention": {
        "tau": [0.5], "beta": [0, 1], "causal": [0, 1]}},
        (AttentionInputs("normal", ((1, 2, 6, 6, 4),)),))
    outcomes = run_attention_selftest(ATTENTION_MUTANTS, [ATTENTION_CONTROL], matrix, None)
    assert [o.ok for o in outcomes] == [True] * len(outcomes)
    # every mutant (the family's on their default grids: eta 0 and 1, bias 0 and -ln 64)
    assert [o.failed_cases > 0 for o in outcomes] == [True] * len(ATTENTION_MUTANTS) + [False]
    assert len(ATTENTION_MUTANTS) == 11


def test_records_carry_five_sizes_and_row_records_keep_two():
    base = {"kernel": "x", "function": "elastic_attention", "dtype": "fp32", "input": "normal",
            "seed": 1, "passed": True, "shape": [1, 2, 8, 8, 4]}
    assert VerifyRecord.from_dict(base).shape == (1, 2, 8, 8, 4)
    with pytest.raises(RecordError, match="shape"):
        VerifyRecord.from_dict({**base, "function": "elastic"})
    with pytest.raises(RecordError, match="shape"):
        VerifyRecord.from_dict({**base, "shape": [1, 2]})


WRONG = '''
import torch
from elasticbench import register_kernel
from elasticbench.attention import flash

@register_kernel(function="elastic_attention", backend="torch", name="wrong_attention")
def wrong_attention(q, k, v, *, tau, beta, scale, causal):
    out = flash.forward(q, k, v, tau, beta, scale, causal)[0]
    return out * 1.001 if causal and out.dtype == torch.float32 else out
'''


def test_cli_verifies_attention_kernels_and_its_reproduce_lines_rerun_the_case(
        cli, tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)  # a width in the environment folds on request
    r = cli("verify", "--function", "elastic_attention", "--case",
            "cases/verify-attention-quick.toml", "-d", "fp32", "--input", "normal",
            "--mode", "both")
    assert r.code == 0, r.out + r.err
    assert "torch_attention_flash" in r.out and "0 failed" in r.out
    path = tmp_path / "wrong.py"
    path.write_text(WRONG)
    out = tmp_path / "w.json"
    r = cli("verify", "--kernel-file", str(path), "--case", "cases/verify-attention-quick.toml",
            "-d", "fp32,fp64", "--json", str(out))
    assert r.code == 1
    failing = [x for x in json.loads(out.read_text())["records"] if not x["passed"]]
    assert failing and all(x["dtype"] == "fp32" and x["params"]["causal"] == 1 for x in failing)
    lines = [ln.split("reproduce: ", 1)[1] for ln in r.out.splitlines() if "reproduce: " in ln]
    assert len(lines) == len({(x["input"], tuple(x["shape"]), tuple(x["params"].items()))
                              for x in failing})
    words = shlex.split(lines[0])
    assert words[:2] == ["elasticbench", "verify"] and "--size" in words
    again = tmp_path / "again.json"
    r2 = cli(*words[1:], "--json", str(again))
    assert again.exists(), (lines[0], r2.out, r2.err)
    records = json.loads(again.read_text())["records"]
    assert r2.code == 1 and len(records) == 1 and not records[0]["passed"]


def test_cli_bad_attention_input_is_one_line_and_exit_2(cli):
    for args in (["-s", "4x4"], ["--input", "huge_rows"], ["--param", "causal=0.5"]):
        r = cli("verify", "--function", "elastic_attention", *args)
        assert r.code == 2 and r.err.count("\n") == 1, (args, r.err)
    r = cli("verify", "--only", "torch_elastic,torch_attention_flash")
    assert r.code == 2 and "apart" in r.err
