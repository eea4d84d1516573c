"""Cog attention (elasticbench.functional.cog_attention, elasticbench.nn.CogAttention)
against the paper's formula written here in plain fp64 torch, on the tiled torch code and
the native kernel: values, the gradients of q, k and v, masks, causal alignment, gradcheck,
the second order, and the special-value policy of docs/attention.md section 9 (zero scores,
ties in |s|, all-negative rows, +-inf and NaN scores, empty shapes, 16-bit inputs)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from elasticbench import dispatch, settings
from elasticbench import functional as F
from elasticbench import nn as enn
from elasticbench.attention import autograd, flash, native_attention
from elasticbench.attention.weights import Weight

F64 = torch.float64


@pytest.fixture(autouse=True)
def _forget_the_implementation_read() -> Iterator[None]:
    yield  # the settings keep $ELASTICBENCH_IMPLEMENTATION once read; tests here change it
    settings.refresh()


def _hidden(lq: int, lk: int, causal, mask) -> torch.Tensor:
    """(Lq, Lk)-broadcastable bool: True where the key does not exist for the query."""
    hidden = torch.zeros(lq, lk, dtype=torch.bool)
    if causal:
        offset = lk - lq if causal == "bottom_right" else 0
        hidden = torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + offset
    return hidden if mask is None else hidden | ~mask


def definition(q, k, v, *, scale=None, causal=False, mask=None):
    """Lv et al.'s w_ij = sign(s_ij) exp(|s_ij|) / sum_j' exp(|s_ij'|) over the visible keys,
    materialized in fp64 without a shift (the tests' scores are small)."""
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    hidden = _hidden(s.shape[-2], s.shape[-1], causal, mask).expand(s.shape)
    s = s.masked_fill(hidden, 0.0)
    e = torch.exp(s.abs()).masked_fill(hidden, 0)
    den = e.sum(-1, keepdim=True)
    w = torch.where(den > 0, torch.sign(s) * e / den.clamp_min(1e-300), 0)
    return w @ v


def definition_grads(q, k, v, dout, *, scale=None, causal=False, mask=None):
    """dq, dk, dv from the spec's formula ds = p g - w c (p = exp(|s|)/D, w = sign(s) p,
    g = dO v^T, c = rowsum(dO out)), the mean one-sided derivative at a zero score."""
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    s = (q @ k.transpose(-1, -2)) * scale
    hidden = _hidden(s.shape[-2], s.shape[-1], causal, mask).expand(s.shape)
    s = s.masked_fill(hidden, 0.0)
    e = torch.exp(s.abs()).masked_fill(hidden, 0)
    den = e.sum(-1, keepdim=True)
    p = torch.where(den > 0, e / den.clamp_min(1e-300), 0)
    w = torch.sign(s) * p
    out = w @ v
    g = dout @ v.transpose(-1, -2)
    c = (dout * out).sum(-1, keepdim=True)
    ds = p * g - w * c
    return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, w.transpose(-1, -2) @ dout


def _qkv(lq, lk, d=8, b=2, h=3, dtype=F64, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_(grad)
            for n in (lq, lk, lk)]


def _dout(out, seed=1):
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),
                       dtype=out.dtype)


@pytest.fixture(params=[autograd.TORCH, autograd.CPP], ids=lambda i: i.name)
def impl(request, monkeypatch):
    """Tiles smaller than the inputs (several blocks each way), on the tiled torch code and
    on the native kernel (skipped where it is not built)."""
    chosen = request.param
    if not chosen.accepts(torch.zeros(1), Weight.COG):
        pytest.skip(f"{chosen.name} does not run here")
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, chosen.name)
    settings.refresh()  # the variable is read once: read it again
    monkeypatch.setattr(native_attention, "BLOCK_Q", 3)
    monkeypatch.setattr(native_attention, "BLOCK_K", 2)
    monkeypatch.setattr(flash, "FAMILY_BLOCK_Q", 3)
    monkeypatch.setattr(flash, "FAMILY_BLOCK_K", 2)
    return chosen


@pytest.mark.parametrize(("lq", "lk", "causal"), [(7, 7, False), (7, 7, True), (4, 9, True),
                                                  (9, 4, True), (4, 9, "bottom_right"),
                                                  (9, 4, "bottom_right")])
def test_matches_the_definition_values_and_gradients(impl, lq, lk, causal):
    q, k, v = _qkv(lq, lk)
    out = F.cog_attention(q, k, v, causal=causal)
    want = definition(q, k, v, causal=causal)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-13)
    dout = _dout(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    for a, b, c in zip(got, torch.autograd.grad(want, (q, k, v), dout),
                       definition_grads(q, k, v, dout, causal=causal), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-11, atol=1e-12)


def test_weights_are_signed_and_their_absolute_values_sum_to_one():
    q, k, _ = _qkv(5, 6, grad=False)
    eye = torch.eye(6, dtype=F64).expand(2, 3, 6, 6)  # v = I: out is the weight matrix
    w = F.cog_attention(q, k, eye)
    assert (w < 0).any() and (w > 0).any()
    torch.testing.assert_close(w.abs().sum(-1), torch.ones(2, 3, 5, dtype=F64))


def test_key_padding_stays_fused_and_other_masks_match_the_definition(impl):
    q, k, v = _qkv(5, 6)
    pad = torch.tensor([[True, True, False, True, False, True],
                        [False] * 6])[:, None, None, :]  # the second batch sees no key
    out = F.cog_attention(q, k, v, attn_mask=pad, causal=True)
    want = definition(q, k, v, mask=pad, causal=True)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-13)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    dout = _dout(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    for a, b in zip(got, torch.autograd.grad(want, (q, k, v), dout), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
    assert all(torch.equal(g[1], torch.zeros_like(g[1])) for g in got)
    per_query = torch.rand(5, 6, generator=torch.Generator().manual_seed(3)) > 0.4
    out = F.cog_attention(q, k, v, attn_mask=per_query)
    want = definition(q, k, v, mask=per_query)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-13)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), dout),
                    torch.autograd.grad(want, (q, k, v), dout), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
    float_mask = torch.where(per_query, 0.25, -math.inf).to(F64)  # -inf hides, 0.25 adds
    out = F.cog_attention(q, k, v, attn_mask=float_mask)
    s = (q @ k.transpose(-1, -2)) * 8 ** -0.5 + 0.25
    e = torch.exp(s.abs()).masked_fill(~per_query, 0)
    want = (torch.sign(s) * e / e.sum(-1, keepdim=True)).masked_fill(~per_query, 0) @ v
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-13)
    with torch.no_grad():  # a NaN or inf in a padded key does not exist for anyone
        k[0, :, 2] = math.nan
        k[0, :, 4] = math.inf
    torch.testing.assert_close(F.cog_attention(q, k, v, attn_mask=pad, causal=True),
                               definition(q.detach(), k.detach().nan_to_num(0, 0, 0),
                                          v.detach(), mask=pad, causal=True),
                               rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", ["torch", "cpp"])
def test_gradcheck_of_the_fused_implementations(monkeypatch, name):
    if not autograd.implementation(name).accepts(torch.zeros(1), Weight.COG):
        pytest.skip(f"{name} does not run here")
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, name)
    settings.refresh()
    monkeypatch.setattr(flash, "FAMILY_BLOCK_Q", 2)
    monkeypatch.setattr(flash, "FAMILY_BLOCK_K", 3)
    monkeypatch.setattr(native_attention, "BLOCK_Q", 2)
    monkeypatch.setattr(native_attention, "BLOCK_K", 3)
    q, k, v = _qkv(3, 4, d=3, b=1, h=2)
    pad = torch.tensor([True, False, True, True])

    def fn(q, k, v):
        return F.cog_attention(q, k, v, causal="bottom_right", attn_mask=pad)
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_second_order_through_create_graph_is_the_definitions():
    """Through the composite (exact twice): the Hessian-vector product of a loss matches
    autograd through the definition, and gradgradcheck holds."""
    q, k, v = _qkv(4, 5, d=3, b=1, h=2)
    hv = []
    for f in (F.cog_attention, definition):
        out = f(q, k, v, causal=True)
        g = torch.autograd.grad(out.pow(2).sum(), (q, k, v), create_graph=True)
        hv.append(torch.autograd.grad(sum(x.pow(2).sum() for x in g), (q, k, v)))
    for a, b in zip(*hv, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    q, k, v = _qkv(2, 3, d=2, b=1, h=1)
    assert torch.autograd.gradgradcheck(lambda *x: F.cog_attention(*x, causal=True),
                                        (q, k, v))


def test_a_zero_score_has_weight_zero_a_share_of_the_denominator_and_gradient_p_g(impl):
    """Key 1 is orthogonal to every query (its scores are exactly 0): its weight is 0, it
    counts exp(0) in the denominator, and ds there is p g (the mean of the one-sided
    derivatives), so dk and dq carry it."""
    q, k, v = _qkv(4, 5, d=4, b=1, h=2)
    with torch.no_grad():
        q[..., 3] = 0.0
        k[:, :, 1] = 0.0
        k[:, :, 1, 3] = 1.0  # k_1 . q_i = 0 for every query
    eye = torch.eye(5, dtype=F64).expand(1, 2, 5, 5)
    w = F.cog_attention(q.detach(), k.detach(), eye)
    assert torch.equal(w[..., 1], torch.zeros_like(w[..., 1]))
    out = F.cog_attention(q, k, v)
    torch.testing.assert_close(out, definition(q, k, v), rtol=1e-12, atol=1e-13)
    dout = _dout(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = definition_grads(q.detach(), k.detach(), v.detach(), dout)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
    assert got[1][0, :, 1].abs().amax() > 1e-3  # the zero score's key gets a gradient


def test_ties_in_abs_s_across_signs_cancel(impl):
    """Scores +a and -a tie in |s|: weights +p and -p, so equal values cancel exactly."""
    q = torch.tensor([[[[1.0, 0.0]]]], dtype=F64)
    k = torch.tensor([[[[2.0, 0.0], [-2.0, 0.0], [0.5, 0.0]]]], dtype=F64)
    v = torch.tensor([[[[3.0, 1.0], [3.0, 1.0], [0.0, 2.0]]]], dtype=F64)
    out = F.cog_attention(q, k, v, scale=1.0)
    e2, e05 = math.exp(2.0), math.exp(0.5)
    want = torch.tensor([0.0, (e2 - e2 + 2 * e05) / (2 * e2 + e05)], dtype=F64)
    torch.testing.assert_close(out[0, 0, 0], want, rtol=1e-15, atol=1e-15)


def test_an_all_negative_row_subtracts_its_values(impl):
    """Every score negative: the weights are -softmax(|s|), the output minus softmax's."""
    q, k, v = _qkv(3, 5, d=4, b=1, h=1, grad=False)
    k = -q[:, :, :1].abs().expand(1, 1, 5, 4) * torch.linspace(0.2, 1.0, 5,
                                                                dtype=F64)[:, None]
    q = q.abs()
    s = (q @ k.transpose(-1, -2)) * 0.5
    assert (s < 0).all()
    out = F.cog_attention(q, k, v)
    torch.testing.assert_close(out, -(torch.softmax(-s, -1) @ v), rtol=1e-12, atol=1e-13)


def test_nan_in_a_query_makes_exactly_its_output_nan(impl):
    q, k, v = _qkv(5, 5, b=1, h=1, grad=False)
    q[0, 0, 1, 3] = math.nan
    out = F.cog_attention(q, k, v)
    assert out[0, 0, 1].isnan().all() and not out[0, 0, [0, 2, 3, 4]].isnan().any()
    q, k, v = _qkv(5, 5, b=1, h=1)
    with torch.no_grad():
        k[0, 0, 3, 0] = math.nan  # seen by queries 3 and 4 only, causally
    out = F.cog_attention(q, k, v, causal=True)
    assert out[0, 0, 3:].isnan().all() and not out[0, 0, :3].isnan().any()
    dq, = torch.autograd.grad(out, (q,), _dout(out))  # the others: 0 * NaN in ds @ k
    assert dq[0, 0, 3:].isnan().all()


def test_infinite_scores_of_either_sign_take_the_signed_limit(impl):
    """Query 1 scores +inf at keys 0, 2 and -inf at keys 1, 3 (|s| infinite at all four) and
    finite ones at 4, 5: w = sign(s)/4 at the four, 0 at the others; dq of that query is 0,
    dv gets sign(s) dO/4 at the four keys."""
    q, k, v = _qkv(3, 6, b=1, h=1, d=2)
    with torch.no_grad():
        q[0, 0, 1] = torch.tensor([math.inf, 0.0])
        k[0, 0, :, 0] = torch.tensor([1.0, -1.0, 2.0, -3.0, 0.0, 0.0])
        k[0, 0, :, 1] = 1.0
        q[0, 0, 1, 1] = 0.0  # the scores at keys 4, 5: inf * 0 is NaN; made 0 below
        k[0, 0, 4:, 0] = 1e-300  # inf * 1e-300 is inf: give them +-inf too, then count
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0], dtype=F64)
    out = F.cog_attention(q, k, v)
    torch.testing.assert_close(out[0, 0, 1], (sign[:, None] * v[0, 0]).mean(0).detach(),
                               rtol=1e-15, atol=1e-15)
    assert out[0, 0, [0, 2]].isfinite().all()
    dout = torch.zeros_like(out)
    dout[0, 0, 1] = torch.tensor([0.5, -2.0], dtype=F64)
    dq, dv = torch.autograd.grad(out, (q, v), dout)
    assert torch.equal(dq[0, 0, 1], torch.zeros(2, dtype=F64))
    torch.testing.assert_close(dv[0, 0], sign[:, None] / 6 * dout[0, 0, 1], rtol=1e-15,
                               atol=0)


def test_a_computed_minus_inf_next_to_padded_keys_is_still_infinite(impl):
    """A partially padded tile (keys 2, 3 with 2 padded, tiles of 2 keys): its hidden key
    and a kept key's -inf score both reach the kernel as -inf, and only the kept one counts
    (the native kernel tells them apart)."""
    q, k, v = _qkv(2, 6, b=1, h=1, d=2, grad=False)
    q[0, 0, 0] = torch.tensor([-1e200, 0.0], dtype=F64)
    q[0, 0, 1, 0] = 0.0  # query 1's scores stay finite
    k[0, 0, :, 0] = torch.tensor([0.1, 0.3, 0.2, 1e200, -0.4, 0.5], dtype=F64)  # 3: -inf
    pad = torch.tensor([True, True, False, True, True, False])
    out = F.cog_attention(q, k, v, attn_mask=pad)
    torch.testing.assert_close(out[0, 0, 0], -v[0, 0, 3], rtol=0, atol=0)
    torch.testing.assert_close(out[0, 0, 1], definition(q, k, v, mask=pad)[0, 0, 1],
                               rtol=1e-12, atol=1e-13)


def test_empty_queries_and_keys_and_a_query_with_no_key():
    for lq, lk in ((0, 4), (3, 0)):
        q, k, v = _qkv(lq, lk, d=2, b=1, h=2)
        out = F.cog_attention(q, k, v, causal=lq == 0)
        assert out.shape == (1, 2, lq, 2)
        assert torch.equal(out, torch.zeros_like(out))
        for g, x in zip(torch.autograd.grad(out, (q, k, v), torch.ones_like(out)), (q, k, v),
                        strict=True):
            assert torch.equal(g, torch.zeros_like(x))
    q, k, v = _qkv(4, 2, d=2, b=1, h=1)  # bottom-right: queries 0 and 1 see no key
    with torch.no_grad():
        v[0, 0, 0] = math.nan
    out = F.cog_attention(q, k, v, causal="bottom_right")
    assert torch.equal(out[0, 0, :2], torch.zeros(2, 2, dtype=F64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs_compute_in_fp32(impl, dtype):
    q, k, v = _qkv(6, 6, dtype=dtype)
    ours = F.cog_attention(q, k, v, causal=True)
    want = definition(q.double(), k.double(), v.double(), causal=True)
    assert ours.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(ours.double(), want, rtol=2 * eps, atol=2 * eps)
    dout = _dout(ours).to(dtype)
    got = torch.autograd.grad(ours, (q, k, v), dout)
    want_g = definition_grads(q.double(), k.double(), v.double(), dout.double(), causal=True)
    for a, b in zip(got, want_g, strict=True):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), b, rtol=8 * eps, atol=8 * eps)


def test_the_custom_op_takes_cog():
    q, k, v = _qkv(3, 5, d=4, b=1, h=2)
    zero = torch.zeros(1, 2, dtype=F64)
    out = torch.ops.elasticbench.attention(q, k, v, zero, zero, 0.5, True, None,
                                           int(Weight.COG))[0]
    torch.testing.assert_close(out, definition(q, k, v, scale=0.5, causal=True),
                               rtol=1e-12, atol=1e-13)


@pytest.mark.ci
def test_opcheck_of_the_custom_op_with_cog():
    q, k, v = _qkv(3, 5, d=4, b=1, h=2)
    zero = torch.zeros(1, 2, dtype=F64)
    torch.library.opcheck(torch.ops.elasticbench.attention.default,
                          (q, k, v, zero, zero, 0.5, True, None, int(Weight.COG)))


def test_the_module_is_the_function():
    q, k, v = _qkv(4, 6, grad=False)
    mod = enn.CogAttention(causal="bottom_right")
    torch.testing.assert_close(mod(q, k, v), F.cog_attention(q, k, v, causal="bottom_right"),
                               rtol=0, atol=0)
    assert list(mod.parameters()) == []
    with pytest.raises(ValueError, match="causal"):
        F.cog_attention(q, k, v, causal="bottom-right")
