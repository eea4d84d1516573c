"""Verifying cog attention (docs/attention.md section 9): the tiled torch kernel passes its
budget on the cog inputs in every dtype, forward and backward; an error of 1e-4 in an output
or a gradient fails; the cog mutants (sign dropped, |s| for s) fail; and the budget's terms
are built from |w| (the signed weights, a zero score's p). Tiny shapes throughout."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from elasticbench.attention import flash
from elasticbench.attention.weights import Weight
from elasticbench.harness.functions import get_attention_function
from elasticbench.harness.kinds.attention.mutant_kernels import ATTENTION_MUTANTS
from elasticbench.harness.kinds.attention.qkv_inputs import generate_qkv
from elasticbench.harness.kinds.attention.scoring import check_backward, check_forward
from elasticbench.harness.numerics.budgets.attention_budgets import (
    ATTENTION_BUDGETS,
    SIGNED,
    Conditioning,
)
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.numerics.truth.attention_truth import evaluate

COG = get_attention_function("cog_attention")
SHAPE = (1, 2, 6, 7, 4)
SCALE = 1 / math.sqrt(SHAPE[4])


def _case(gen: str, dtype: str, causal: bool, seed: int = 5):
    q, k, v = generate_qkv(gen, dtype, SHAPE, seed)
    fmt = get_format(dtype)
    dout = fmt.cast(np.random.default_rng(seed).standard_normal((*q.shape[:3], v.shape[3])))
    params = COG.validate_params({"causal": float(causal)})
    f64 = [a.astype(np.float64) for a in (q, k, v)]
    truth = evaluate(COG, params, *f64, SCALE, dout.astype(np.float64))
    cond = Conditioning(COG, params, *f64, SCALE, truth, fmt, ATTENTION_BUDGETS[dtype])
    return q, k, v, dout, truth, cond, fmt


def _flash(q, k, v, dout, causal):
    t = [torch.from_numpy(np.ascontiguousarray(a)) if a.dtype != np.dtype("V2")
         else None for a in (q, k, v, dout)]
    wd = torch.float64 if q.dtype == np.float64 else torch.float32
    zero = torch.zeros(q.shape[:2], dtype=wd)
    out, m, den = flash.forward(*t[:3], zero, zero, SCALE, causal, weight=Weight.COG)[:3]
    dq, dk, dv, _, _ = flash.backward(*t[:3], out, t[3], m, den, zero, zero, SCALE, causal,
                                      weight=Weight.COG)
    return out.numpy(), [dq.numpy(), dk.numpy(), dv.numpy()]


@pytest.mark.parametrize("gen", ["normal", "straddle_zero", "abs_ties", "zero_scores",
                                 "all_negative"])
@pytest.mark.parametrize("dtype", ["fp64", "fp32", "fp16"])
def test_the_tiled_kernel_passes_on_the_cog_inputs(gen, dtype):
    for causal in (False, True):
        q, k, v, dout, truth, cond, fmt = _case(gen, dtype, causal)
        out, grads = _flash(q, k, v, dout, causal)
        r = check_forward(out, truth, cond, fmt)
        assert r.passed, r.reason
        saved = fmt.cast(np.nan_to_num(truth.out_hi)).astype(np.float64)
        r, _ = check_backward(grads, truth, cond, COG, dout.astype(np.float64), saved, fmt)
        assert r.passed, r.reason


def test_inputs_give_what_cog_needs():
    _, _, _, _, truth, _, _ = _case("all_negative", "fp64", False)
    assert (truth.w < 0).all()  # every weight negative: the signed sum cancels nothing
    _, _, _, _, truth, _, _ = _case("abs_ties", "fp64", False)
    # s and -s in one row: weights +p and -p
    np.testing.assert_array_equal(truth.w[..., 1::2], -truth.w[..., 0:6:2])
    _, _, _, _, truth, cond, _ = _case("straddle_zero", "fp64", False)
    assert (truth.w > 0).any() and (truth.w < 0).any() and (truth.w == 0).any()
    # a zero score: w = 0, but its p enters the budget (its ds = p g)
    zero = truth.w == 0
    assert cond.form == SIGNED and (cond.w[zero] > 0).all() and (cond.dw[zero] > 0).all()
    np.testing.assert_allclose(cond.w.sum(-1), 1.0, rtol=1e-12)


def test_an_error_of_1e4_fails_forward_and_backward():
    q, k, v, dout, truth, cond, fmt = _case("straddle_zero", "fp32", True)
    out, grads = _flash(q, k, v, dout, True)
    r = check_forward((out * np.float32(1 + 1e-4)).astype(np.float32), truth, cond, fmt)
    assert not r.passed and r.reason.startswith("accuracy: out")
    saved = fmt.cast(np.nan_to_num(truth.out_hi)).astype(np.float64)
    worse = [grads[0], grads[1] * np.float32(1 + 1e-4), grads[2]]
    r, _ = check_backward(worse, truth, cond, COG, dout.astype(np.float64), saved, fmt)
    assert not r.passed and "dk" in r.reason


@pytest.mark.parametrize("name", ["attention_cog_sign_dropped", "attention_cog_no_abs"])
def test_the_cog_mutants_fail_where_the_kernel_passes(name):
    mutant = next(m.spec for m in ATTENTION_MUTANTS if m.spec.name == name)
    q, k, v, _, truth, cond, fmt = _case("normal", "fp32", False)
    got = mutant.fn(*(torch.from_numpy(a) for a in (q, k, v)), scale=SCALE, causal=False)
    r = check_forward(got.numpy(), truth, cond, fmt)
    assert not r.passed and r.reason.startswith("accuracy")


def _eager(q, k, v, dout, causal):
    """Cog as a user writes it in torch, its gradients by autograd: sign and abs have
    derivative 0 at 0, so a zero score's ds is 0 where the reference's is p g."""
    t = [torch.from_numpy(np.ascontiguousarray(a)).requires_grad_(i < 3)
         for i, a in enumerate((q, k, v, dout))]
    s = SCALE * t[0] @ t[1].transpose(-1, -2)
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("nan"))
    a = s.abs()
    e = torch.exp(a - a.nan_to_num(-1.0).amax(-1, keepdim=True))
    if causal:
        e = e.nan_to_num(0.0)
    w = torch.sign(s).nan_to_num(0.0) * e / e.sum(-1, keepdim=True)
    out = w @ t[2]
    out.backward(t[3])
    return out.detach().numpy(), [x.grad.numpy() for x in t[:3]]


@pytest.mark.parametrize("gen", ["straddle_zero", "zero_scores"])
@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
def test_autograds_zero_gradient_at_a_zero_score_passes_as_p_g_does(gen, dtype):
    # the weight jumps at s = 0: the reference takes the mean one-sided derivative (p g),
    # autograd 0; both are right, and the budget allows the difference at such keys only
    q, k, v, dout, truth, cond, fmt = _case(gen, dtype, False)
    assert (truth.w == 0).any()
    out, grads = _eager(q, k, v, dout, False)
    assert check_forward(out, truth, cond, fmt).passed
    saved = fmt.cast(np.nan_to_num(truth.out_hi)).astype(np.float64)
    r, _ = check_backward(grads, truth, cond, COG, dout.astype(np.float64), saved, fmt)
    assert r.passed, r.reason
    # ...but a gradient wrong elsewhere still fails
    worse = [grads[0] * (1 + 1e-4), grads[1], grads[2]]
    r, _ = check_backward(worse, truth, cond, COG, dout.astype(np.float64), saved, fmt)
    assert not r.passed and "dq" in r.reason
