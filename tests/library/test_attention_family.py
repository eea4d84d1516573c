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
from elasticbench.harness.functions import FUNCTIONS

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
    got = attention_composite(Weight.ELASTIC, q, k, v, p_score=0.7, p_den=0.3, scale=0.5,
                              causal=True)
    want = elastic_attention_composite(q, k, v, tau=0.7, beta=0.3, scale=0.5, causal=True)
    assert torch.equal(got, want)


@pytest.mark.parametrize("weight", list(ROWS))
def test_weights_are_the_row_reference_over_visible_keys(weight: Weight) -> None:
    q, k, _ = _qkv(1)
    w = attention_weights(weight, q, k, p_score=0.0, p_den=0.4, scale=0.5, causal=True)
    s = (q @ k.transpose(-1, -2) * 0.5).numpy()
    name, params = ROWS[weight]
    for b, h, i in np.ndindex(*s.shape[:3]):
        truth = FUNCTIONS[name].reference_row(s[b, h, i, :i + 1], **params)
        want = np.array([float(y) for y in truth.y])
        np.testing.assert_allclose(w[b, h, i, :i + 1].numpy(), want, rtol=1e-14, atol=1e-300)
        assert not w[b, h, i, i + 1:].any()  # causally hidden: exactly 0


def test_sigmoid_is_elementwise_with_its_bias() -> None:
    q, k, _ = _qkv(2)
    w = attention_weights(Weight.SIGMOID, q, k, p_score=-math.log(5), p_den=0.0, scale=0.5,
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
    w = attention_weights(weight, torch.ones(1, 1, 1, 1, dtype=F64), s, p_score=1.0, p_den=1.0,
                          scale=1.0, causal=False, attn_mask=mask)
    assert w.flatten().tolist() == pytest.approx(want, rel=1e-15)


@pytest.mark.parametrize("weight", list(Weight))
def test_nan_score_makes_the_query_nan(weight: Weight) -> None:
    q, k, v = _qkv(3, b=1, h=1)
    k[0, 0, 2, 0] = math.nan
    out = attention_composite(weight, q, k, v, p_score=0.5, p_den=1.0, scale=0.5, causal=True)
    assert out[0, 0, 2:].isnan().all() and out[0, 0, :2].isfinite().all()


@pytest.mark.parametrize("weight", list(Weight))
def test_query_without_keys_gives_zeros_and_zero_gradients(weight: Weight) -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(4))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[:, :, 0] = False  # query 0 sees nothing
    fmask = torch.zeros(2, 1, 5, 5, dtype=F64).masked_fill(~mask, -math.inf)
    for m in (mask, fmask):
        out = attention_composite(weight, q, k, v, p_score=0.5, p_den=1.0, scale=0.5, causal=False,
                                  attn_mask=m)
        assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
        (dq,) = torch.autograd.grad(out.sum(), q)
        assert torch.equal(dq[:, :, 0], torch.zeros_like(dq[:, :, 0]))
        assert dq.isfinite().all()


@pytest.mark.parametrize("weight", list(Weight))
def test_gradients_first_and_second_order(weight: Weight) -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(5, b=1, h=2, lq=3, lk=3, d=2))
    p_score = torch.tensor([0.8, -0.5], dtype=F64, requires_grad=True)
    p_den = torch.tensor([0.3, 1.0], dtype=F64, requires_grad=True)
    if weight is Weight.ELASTIC:
        p_score = p_score.detach().abs().requires_grad_()  # tau > 0

    def f(*args):
        return attention_composite(weight, *args[:3], p_score=args[3], p_den=args[4], scale=0.5,
                                   causal=True)

    assert torch.autograd.gradcheck(f, (q, k, v, p_score, p_den), fast_mode=True)
    assert torch.autograd.gradgradcheck(f, (q, k, v, p_score, p_den), fast_mode=True)


# --- the exact references of the family's attention (functions/, numerics/) ---------------

import mpmath  # noqa: E402

from elasticbench.harness.functions import get_attention_function  # noqa: E402
from elasticbench.harness.numerics.dtypes import get_format  # noqa: E402
from elasticbench.harness.numerics.truth.attention_truth import certified_phase, oracle_evaluate  # noqa: E402

FAMILY = {"softmax1_attention": {}, "symax_attention": {"eta": 0.7},
          "stablemax_attention": {}, "sigmoid_attention": {"bias": -1.3}}


def _loss(fn, row, g, params):
    truth = fn.row.reference_row(row, **params)
    return mpmath.fsum(gi * yi for gi, yi in zip(g, truth.y, strict=True))


@pytest.mark.parametrize("name", ["symax_attention", "stablemax_attention", "sigmoid_attention"])
def test_row_gradients_are_the_derivatives_of_the_references(name: str) -> None:
    fn = get_attention_function(name)
    row, g = [0.75, -1.5, 2.25, -0.125], [0.5, -1.0, 0.25, 2.0]
    params = {p: v for p, v in FAMILY[name].items()}
    with mpmath.workprec(200):
        grad = fn.gradient_row(row, g, **params)
        h = mpmath.mpf(2) ** -60
        for k in range(len(row)):
            up = [mpmath.mpf(x) + (h if i == k else 0) for i, x in enumerate(row)]
            dn = [mpmath.mpf(x) - (h if i == k else 0) for i, x in enumerate(row)]
            fd = (_loss(fn, up, g, params) - _loss(fn, dn, g, params)) / (2 * h)
            assert abs(grad.dx[k] - fd) <= mpmath.mpf(10) ** -30 * (1 + abs(fd))
        for p in params:  # deta, dbias
            up = _loss(fn, row, g, {**params, p: mpmath.mpf(params[p]) + h})
            dn = _loss(fn, row, g, {**params, p: mpmath.mpf(params[p]) - h})
            assert abs(grad.dparams[p] - (up - dn) / (2 * h)) <= mpmath.mpf(10) ** -30


def test_symax_special_rows() -> None:
    fn = get_attention_function("symax_attention")
    zero = fn.gradient_row([0.0, 0.0, -0.0], [1.0, 2.0, 3.0], eta=0.0)  # 0/0: zeros
    assert zero.truth.kind == "masked" and all(d == 0 for d in zero.dx)
    inf = fn.row.reference_row([1.0, -math.inf, math.inf], eta=1.0)  # |-inf| = inf
    assert [float(y) for y in inf.y] == [0.0, 0.5, 0.5]
    # d|s|/ds at 0 is taken as 0
    assert fn.gradient_row([0.0, 1.0], [1.0, 2.0], eta=1.0).dx[0] == 0


def test_sigmoid_reference_is_elementwise() -> None:
    fn = get_attention_function("sigmoid_attention")
    t = fn.row.reference_row([math.nan, 0.0, math.inf, -math.inf], bias=-1.0)
    assert t.kind == "nan" and t.y[0] is None
    assert [float(y) for y in t.y[1:]] == [1 / (1 + math.e), 1.0, 0.0]
    grad = fn.gradient_row([math.nan, 0.0, 3.0], [1.0, 1.0, 1.0], bias=0.0)
    assert grad.dx[0] is None and grad.dparams["bias"] is None
    assert float(grad.dx[1]) == 0.25  # y (1 - y) at y = 1/2


def test_a_nan_key_makes_only_what_its_sigmoid_weight_reaches_nan() -> None:
    fn = get_attention_function("sigmoid_attention")
    q, k, v = (t.numpy() for t in _qkv(6, b=1, h=1, lq=3, lk=4, d=2))
    k[0, 0, 1, 0] = math.nan
    dout = np.ones((1, 1, 3, 2))
    truth = oracle_evaluate(fn, {"bias": 0.0, "causal": 0.0}, q, k, v, 0.5, dout)
    assert np.isnan(truth.out_hi).all()  # every query sees key 1
    assert np.isnan(truth.dk_hi[0, 0, 1]).all() and np.isnan(truth.dv_hi[0, 0, 1]).all()
    others = [0, 2, 3]
    assert np.isfinite(truth.dv_hi[0, 0, others]).all()
    assert np.isfinite(truth.dk_hi[0, 0, others]).all()
    assert np.isnan(truth.dq_hi).all() and np.isnan(truth.dp_hi).all()
    symax = oracle_evaluate(get_attention_function("symax_attention"),
                            {"eta": 1.0, "causal": 0.0}, q, k, v, 0.5, dout)
    assert np.isnan(symax.dv_hi).all()  # a normalized weight: the whole row


@pytest.mark.parametrize("name", list(FAMILY))
def test_the_certified_phase_takes_symax_and_stablemax_and_declines_the_rest(name: str) -> None:
    fn = get_attention_function(name)
    q, k, v = (t.numpy() for t in _qkv(7, b=1, h=2, lq=4, lk=4, d=3))
    params = {**FAMILY[name], "causal": 0.0}
    dout = np.ones((1, 2, 4, 3))
    cert = certified_phase(fn, params, q, k, v, 0.5, dout, get_format("fp32"))
    truth = oracle_evaluate(fn, params, q, k, v, 0.5, dout, precision=256)
    if name in ("softmax1_attention", "sigmoid_attention"):  # mpmath answers
        assert not cert.ok_rows.any() and not cert.ok_heads.any()
    else:  # numerics/certified/normalize.py: within its bounds of the oracle
        assert cert.ok_rows.all() and cert.ok_heads.all()
        for part in ("out", "dq", "dk", "dv", "dp"):
            err = ((getattr(cert.truth, f"{part}_hi") - getattr(truth, f"{part}_hi"))
                   + (getattr(cert.truth, f"{part}_lo") - getattr(truth, f"{part}_lo")))
            assert (np.abs(err) <= cert.bounds[part] + 1e-300).all(), part
    w = attention_weights(getattr(Weight, fn.weight), *(torch.from_numpy(a) for a in (q, k)),
                          p_score=params.get("bias", 0.0), p_den=params.get("eta", 0.0), scale=0.5,
                          causal=False)
    np.testing.assert_allclose(truth.w, w.numpy(), rtol=1e-14, atol=0)


def test_the_oracles_dot_products_are_exact_then_rounded_once() -> None:
    from elasticbench.harness.numerics.truth.attention_oracle import _parts, exact_dot

    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(1, 24))
        a, b = (rng.standard_normal(n) * 2.0 ** rng.integers(-500, 500, n) for _ in range(2))
        a[rng.random(n) < 0.2] = 0.0
        with mpmath.workprec(128):
            am, bm = [mpmath.mpf(float(x)) for x in a], [mpmath.mpf(float(x)) for x in b]
            got = exact_dot(am, bm, [_parts(x) for x in am], [_parts(x) for x in bm])
        with mpmath.workprec(4000):  # exact: every product's bits within 4000 of each other
            exact = mpmath.fsum(x * y for x, y in zip(am, bm, strict=True))
        with mpmath.workprec(128):
            assert got == +exact
    with mpmath.workprec(128):
        nan = [mpmath.mpf(1), mpmath.nan]
        assert mpmath.isnan(exact_dot(nan, nan, [_parts(x) for x in nan],
                                      [_parts(x) for x in nan]))


@pytest.mark.parametrize("name", list(FAMILY))
def test_the_oracle_holds_at_256_bits(name: str) -> None:
    """The family's mpmath truths (forward and gradients) at 128 bits, the default, agree
    with 256 bits to 2^-100 relative: no cancellation eats the working precision."""
    from elasticbench.harness.kinds.attention.qkv_inputs import generate_qkv

    fn = get_attention_function(name)
    for gen in ("normal", "near_zero", "huge"):
        q, k, v = (a.astype(np.float64) for a in generate_qkv(gen, "fp32", (1, 2, 6, 6, 4), 2))
        dout = np.random.default_rng(1).standard_normal((1, 2, 6, 4))
        params = {**FAMILY[name], "causal": 1.0}
        lo_bits, hi_bits = (oracle_evaluate(fn, params, q, k, v, 0.5, dout, precision=p)
                            for p in (128, 256))
        for part in ("out", "dq", "dk", "dv", "dp"):
            a = getattr(lo_bits, f"{part}_hi") + getattr(lo_bits, f"{part}_lo")
            b = getattr(hi_bits, f"{part}_hi")
            diff = (getattr(lo_bits, f"{part}_hi") - b) + (getattr(lo_bits, f"{part}_lo")
                                                           - getattr(hi_bits, f"{part}_lo"))
            assert (np.abs(diff) <= 2.0**-100 * np.abs(b) + 1e-300).all(), (gen, part, a, b)
