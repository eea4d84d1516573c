"""attn_mask and is_causal on elastic_attention and ElasticAttention, as SDPA takes them:
padded keys take no weight, a float mask shifts scores before the negative ones drop, a
query left with no key gives zeros and finite zero gradients."""

from __future__ import annotations

import pytest
import torch

from elasticbench.functional import elastic_attention
from elasticbench.nn import ElasticAttention

F64 = torch.float64


def _qkv(b=2, h=3, lq=5, lk=7, d=4, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) for n in (lq, lk, lk)]


def test_key_padding_equals_attention_over_the_kept_keys():
    q, k, v = _qkv()
    lengths = [4, 7]
    pad = torch.arange(7)[None, :] < torch.tensor(lengths)[:, None]  # (B, Lk), True: a key
    got = elastic_attention(q, k, v, tau=0.8, beta=0.5, attn_mask=pad[:, None, None, :])
    for b, n in enumerate(lengths):
        want = elastic_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], tau=0.8,
                                 beta=0.5)
        torch.testing.assert_close(got[b:b + 1], want, rtol=1e-12, atol=1e-14)


def test_a_float_mask_is_added_before_negative_scores_drop():
    q, k, v = _qkv(seed=1)
    shift = torch.randn(5, 7, generator=torch.Generator().manual_seed(2), dtype=F64)
    got = elastic_attention(q, k, v, tau=0.6, beta=0.2, attn_mask=shift)
    s = q @ k.transpose(-1, -2) / 2.0 + shift  # scale 1/sqrt(4)
    e = torch.where(s >= 0, torch.exp(s / 0.6), 0)
    want = e / (e.sum(-1, keepdim=True) + 0.2) @ v
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_no_key_left_gives_zeros_and_finite_zero_gradients():
    q, k, v = (t.requires_grad_() for t in _qkv(seed=3))
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False  # query 2 keeps nothing
    out = elastic_attention(q, k, v, tau=1.0, beta=1.0, attn_mask=mask)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[:, :, 2],
                                                       torch.zeros_like(q.grad[:, :, 2]))


def test_is_causal_is_causal_and_the_module_takes_a_mask():
    q, k, v = _qkv(lq=6, lk=6, seed=4)
    a = elastic_attention(q, k, v, tau=0.5, beta=0.25, is_causal=True)
    b = elastic_attention(q, k, v, tau=0.5, beta=0.25, causal=True)
    assert torch.equal(a, b)
    tril = torch.ones(6, 6, dtype=torch.bool).tril()
    c = elastic_attention(q, k, v, tau=0.5, beta=0.25, attn_mask=tril)
    torch.testing.assert_close(c, b, rtol=1e-12, atol=1e-14)
    m = ElasticAttention(tau=0.5, beta=0.25, param_shape=(3,)).double()
    torch.testing.assert_close(m(q, k, v, attn_mask=tril), b, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(m(q, k, v, is_causal=True), b, rtol=1e-12, atol=1e-14)


def test_gradients_through_a_mask_match_a_plain_composite():
    q, k, v = (t.requires_grad_() for t in _qkv(seed=5))
    mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(6)) > 0.3
    assert torch.autograd.gradcheck(
        lambda a, b, c: elastic_attention(a, b, c, tau=0.7, beta=0.4, attn_mask=mask), (q, k, v))


@pytest.mark.parametrize("bad", [torch.ones(3, 3, dtype=torch.bool), torch.ones(5, 7, dtype=torch.int64)])
def test_a_mask_that_does_not_fit_is_one_clear_error(bad):
    q, k, v = _qkv()
    with pytest.raises((ValueError, TypeError), match="attn_mask"):
        elastic_attention(q, k, v, tau=1.0, beta=1.0, attn_mask=bad)
