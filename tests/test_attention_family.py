"""The family's attention composite (attention/composite.py attention_weights,
attention_composite) against the row functions' exact references, its special values,
masks and its first and second derivatives (docs/attention.md section 9)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from elasticbench.attention.composite import (
    attention_composite,
    attention_weights,
    elastic_attention_composite,
)
from elasticbench.attention.weights import Weight
from elasticbench.functions import FUNCTIONS

ROWS = {Weight.SOFTMAX1: ("softmax1", {}), Weight.SYMAX: ("symax", {"eta": 0.4}),
        Weight.STABLEMAX: ("stablemax", {})}
F64 = torch.float64


def _qkv(seed: int = 0, b: int = 2, h: int = 3, lq: int = 5, lk: int = 5, d: int = 4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, lq, d, generator=g, dtype=F64),
            torch.randn(b, h, lk, d, generator=g, dtype=F64),
            torch.randn(b, h, lk, d, generator=g, dtype=F64))


def test_elastic_weight_is_the_elastic_composite() -> None:
    q, k, v = _qkv()
    got = attention_composite(Weight.ELASTIC, q, k, v, p0=0.7, p1=0.3, scale=0.5, causal=True)
    want = elastic_attention_composite(q, k, v, tau=0.7, beta=0.3, scale=0.5, causal=True)
    assert torch.equal(got, want)


@pytest.mark.parametrize("weight", list(ROWS))
def test_weights_are_the_row_reference_over_visible_keys(weight: Weight) -> None:
    q, k, _ = _qkv(1)
    w = attention_weights(weight, q, k, p0=0.0, p1=0.4, scale=0.5, causal=True)
    s = (q @ k.transpose(-1, -2) * 0.5).numpy()
    name, params = ROWS[weight]
    for b, h, i in np.ndindex(*s.shape[:3]):
        truth = FUNCTIONS[name].reference_row(s[b, h, i, :i + 1], **params)
        want = np.array([float(y) for y in truth.y])
        np.testing.assert_allclose(w[b, h, i, :i + 1].numpy(), want, rtol=1e-14, atol=1e-300)
        assert not w[b, h, i, i + 1:].any()  # causally hidden: exactly 0


def test_sigmoid_is_elementwise_with_its_bias() -> None:
    q, k, _ = _qkv(2)
    w = attention_weights(Weight.SIGMOID, q, k, p0=-math.log(5), p1=0.0, scale=0.5,
                          causal=False)
    assert torch.allclose(w, torch.sigmoid(q @ k.transpose(-1, -2) * 0.5 - math.log(5)),
                          rtol=1e-15, atol=0)


@pytest.mark.parametrize(("weight", "want"), [
    (Weight.ELASTIC, [0, 1, 0, 0, 0]),
    (Weight.SOFTMAX1, [0, 1, 0, 0, 0]),
    (Weight.SYMAX, [0, 0.5, 0.5, 0, 0]),  # |-inf| = inf: a share like +inf's
    (Weight.STABLEMAX, [0, 1, 0, 0, 0]),
    (Weight.SIGMOID, [1 / (1 + math.exp(-2)), 1, 0, 1 / (1 + math.exp(-3)), 0]),
])
def test_infinite_scores_take_the_limit(weight: Weight, want: list[float]) -> None:
    s = torch.tensor([1.0, math.inf, -math.inf, 2.0, 5.0], dtype=F64).reshape(1, 1, 5, 1)
    mask = torch.tensor([True, True, True, True, False])  # the last key is hidden
    w = attention_weights(weight, torch.ones(1, 1, 1, 1, dtype=F64), s, p0=1.0, p1=1.0,
                          scale=1.0, causal=False, attn_mask=mask)
    assert w.flatten().tolist() == pytest.approx(want, rel=1e-15)


@pytest.mark.parametrize("weight", list(Weight))
def test_nan_score_makes_the_query_nan(weight: Weight) -> None:
    q, k, v = _qkv(3, b=1, h=1)
    k[0, 0, 2, 0] = math.nan
    out = attention_composite(weight, q, k, v, p0=0.5, p1=1.0, scale=0.5, causal=True)
    assert out[0, 0, 2:].isnan().all() and out[0, 0, :2].isfinite().all()


@pytest.mark.parametrize("weight", list(Weight))
def test_query_without_keys_gives_zeros_and_zero_gradients(weight: Weight) -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(4))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[:, :, 0] = False  # query 0 sees nothing
    fmask = torch.zeros(2, 1, 5, 5, dtype=F64).masked_fill(~mask, -math.inf)
    for m in (mask, fmask):
        out = attention_composite(weight, q, k, v, p0=0.5, p1=1.0, scale=0.5, causal=False,
                                  attn_mask=m)
        assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
        (dq,) = torch.autograd.grad(out.sum(), q)
        assert torch.equal(dq[:, :, 0], torch.zeros_like(dq[:, :, 0]))
        assert dq.isfinite().all()


@pytest.mark.parametrize("weight", list(Weight))
def test_gradients_first_and_second_order(weight: Weight) -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(5, b=1, h=3, lq=4, lk=4, d=3))
    p0 = torch.tensor([0.8, 1.2, -0.5], dtype=F64, requires_grad=True)
    p1 = torch.tensor([0.3, 0.2, 1.0], dtype=F64, requires_grad=True)
    if weight is Weight.ELASTIC:
        p0 = p0.detach().abs().requires_grad_()  # tau > 0

    def f(*args):
        return attention_composite(weight, *args[:3], p0=args[3], p1=args[4], scale=0.5,
                                   causal=True)

    assert torch.autograd.gradcheck(f, (q, k, v, p0, p1))
    assert torch.autograd.gradgradcheck(f, (q, k, v, p0, p1))
