"""A (batch, 1, 1, length_k) bool key-padding mask inside the fused kernels (native and tiled
torch; Triton in tests/library/test_triton_attention.py): forward and all five gradients equal the
materialized composite under the same mask, whole key blocks and partial ones hidden, a
batch with no key left, NaN in a padded key, and elastic_attention routing the mask."""

from __future__ import annotations

import math

import pytest
import torch

from elasticbench import devices
from elasticbench.attention import composite, flash, native_attention
from elasticbench.attention.composite import elastic_attention_composite
from elasticbench.functional import elastic_attention

F64 = torch.float64
IMPLS = [flash, pytest.param(native_attention, marks=pytest.mark.needs("native"))]


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 3 queries x 2 keys in both implementations: the mask hides whole key
    blocks, parts of blocks, and blocks past the last kept key."""
    for mod in (native_attention, flash):
        monkeypatch.setattr(mod, "BLOCK_Q", 3)
        monkeypatch.setattr(mod, "BLOCK_K", 2)


def _qkv(lq=7, lk=9, d=4, b=3, h=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=F64) * 1.5 for n in (lq, lk, lk)]


# batch 0: keys 0-4 kept (trailing padding); batch 1: holes, a whole hidden block (2, 3) and
# keys kept past it; batch 2: nothing kept
KEEP = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0, 0],
                     [1, 0, 0, 0, 1, 1, 0, 1, 0],
                     [0, 0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)


def _reference(q, k, v, tau, beta, causal, do):
    """Composite output and the five gradients under the same mask, by autograd."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v, tau, beta)]
    out = elastic_attention_composite(*leaves[:3], tau=leaves[3][:, :, None, None],
                                      beta=leaves[4][:, :, None, None], scale=0.5,
                                      causal=causal, attn_mask=KEEP[:, None, None, :])
    return out.detach(), torch.autograd.grad(out, leaves, do)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_in_the_fused_loop_equals_the_composite(small_tiles, impl, causal):
    q, k, v = _qkv()
    tau = torch.tensor([[0.5, 2.0]] * 3, dtype=F64)
    beta = torch.tensor([[0.3, 0.0]] * 3, dtype=F64)
    do = torch.randn(3, 2, 7, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    want, grads = _reference(q, k, v, tau, beta, causal, do)
    out, m, den = impl.forward(q, k, v, tau, beta, 0.5, causal, KEEP)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-14)
    got = impl.backward(q, k, v, out, do, m, den, tau, beta, 0.5, causal, KEEP)
    for name, g, w in zip(("dq", "dk", "dv", "dtau", "dbeta"), got, grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=name)
    assert torch.equal(out[2], torch.zeros_like(out[2]))  # batch 2 keeps no key
    for g in got[:3]:
        assert torch.isfinite(g).all() and not g[2].any()
    assert not got[1][:, :, ~KEEP[1]][1].any()  # padded keys get no gradient


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_or_inf_in_a_padded_key_changes_nothing(small_tiles, impl):
    q, k, v = _qkv(seed=2)
    tau, beta = torch.full((3, 2), 0.7, dtype=F64), torch.full((3, 2), 0.5, dtype=F64)
    want, _, _ = impl.forward(q, k, v, tau, beta, 0.5, False, KEEP)
    k2 = k.clone()
    k2[0, :, 6] = math.nan  # a hidden block past batch 0's last kept key
    k2[1, :, 6] = math.inf  # a hidden key inside a block that is visited
    got, m, _ = impl.forward(q, k2, v, tau, beta, 0.5, False, KEEP)
    assert torch.equal(got, want) and torch.isfinite(m).all()


def test_elastic_attention_sends_key_padding_to_the_fused_op(monkeypatch):
    q, k, v = (t.requires_grad_() for t in _qkv(lk=9, b=3))

    def refuse(*args, **kwargs):
        raise AssertionError("a key-padding mask took the materialized path")

    monkeypatch.setattr(composite, "elastic_attention_composite", refuse)
    out = elastic_attention(q, k, v, tau=0.8, beta=0.4, attn_mask=KEEP[:, None, None, :])
    out.sum().backward()
    assert torch.equal(out[2].detach(), torch.zeros_like(out[2]))
    assert torch.isfinite(q.grad).all() and not q.grad[2].any()
    with pytest.raises(AssertionError, match="materialized"):  # a per-query mask does take it
        elastic_attention(q, k, v, tau=0.8, beta=0.4,
                          attn_mask=torch.ones(3, 1, 7, 9, dtype=torch.bool))


def test_key_padding_gradcheck_through_the_fused_op():
    q, k, v = (t[:2, :, :, :3].contiguous().requires_grad_() for t in _qkv(lq=4, seed=3))
    tau = torch.tensor([0.6, 1.4], dtype=F64, requires_grad=True)
    beta = torch.tensor([0.2, 1.0], dtype=F64, requires_grad=True)
    mask = KEEP[:2, None, None, :]
    assert torch.autograd.gradcheck(
        lambda *a: elastic_attention(*a[:3], tau=a[3], beta=a[4], attn_mask=mask),
        (q, k, v, tau, beta))


@pytest.mark.skipif(devices.native_unavailable() is not None, reason="native tier not built")
def test_second_order_through_key_padding_matches_the_composite():
    q, k, v = (t.requires_grad_() for t in _qkv(seed=4))
    mask = KEEP[:, None, None, :]

    def penalty(fn):
        out = fn(q, k, v, tau=0.9, beta=0.3, attn_mask=mask)
        (gq,) = torch.autograd.grad((out * out).sum(), q, create_graph=True)
        return torch.autograd.grad((gq ** 2).sum(), (k, v))

    got = penalty(elastic_attention)
    want = penalty(lambda *a, **kw: elastic_attention_composite(*a, scale=0.5, **kw))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)


@pytest.mark.needs("native")
def test_both_native_backward_schedules_give_the_same_bits_under_key_padding(small_tiles):
    """With fewer (batch, head) pairs than threads the backward spreads key blocks over
    the threads; the skipped and cut blocks must be the same in both schedules."""
    q, k, v = _qkv()
    tau, beta = torch.full((3, 2), 0.8, dtype=F64), torch.full((3, 2), 0.6, dtype=F64)
    do = torch.randn(3, 2, 7, 4, generator=torch.Generator().manual_seed(7), dtype=F64)
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 8):  # 6 pairs: one head per thread, then key blocks spread over 8
            torch.set_num_threads(n)
            out, m, den = native_attention.forward(q, k, v, tau, beta, 0.5, True, KEEP)
            runs.append((out, *native_attention.backward(q, k, v, out, do, m, den, tau, beta,
                                                         0.5, True, KEEP)))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    _, grads = _reference(q, k, v, tau, beta, True, do)
    torch.testing.assert_close(runs[1][1], grads[0], rtol=1e-10, atol=1e-12)
