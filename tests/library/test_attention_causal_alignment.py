"""causal's alignment in elasticbench.functional: False / True / "top_left" (query i sees key
j iff j <= i, SDPA's is_causal) and "bottom_right" (j <= i + Lk - Lq, FlashAttention's and a
decode cache's), every weight, forward and backward, fp32 and bf16, the native kernel and
the tiled torch code (tiles small enough that the diagonal crosses several, and some lie
wholly above it), against autograd through the fp64 composite under the same mask written
out (docs/attention.md section 1). The Triton kernel's offset:
tests/library/test_triton_causal_offset.py."""

from __future__ import annotations

import pytest
import torch

from elasticbench import dispatch
from elasticbench.attention import composite, flash, native_attention
from elasticbench.attention.operands import causal_offset
from elasticbench.attention.weights import Weight
from elasticbench.functional import (
    cog_attention,
    elastic_attention,
    sigmoid_attention,
    softmax1_attention,
    stablemax_attention,
    symax_attention,
)

H = 3
TAU = torch.tensor([0.7, 1.1, 1.5])
BETA = torch.tensor([0.5, 1.0, 2.0])


def _call(weight: Weight, q, k, v, params, **kw) -> torch.Tensor:
    """The public function of `weight` with its tensor parameters (per head)."""
    if weight is Weight.ELASTIC:
        return elastic_attention(q, k, v, tau=params[0], beta=params[1], **kw)
    if weight is Weight.SOFTMAX1:
        return softmax1_attention(q, k, v, **kw)
    if weight is Weight.SYMAX:
        return symax_attention(q, k, v, eta=params[1], **kw)
    if weight is Weight.STABLEMAX:
        return stablemax_attention(q, k, v, **kw)
    if weight is Weight.SIGMOID:
        return sigmoid_attention(q, k, v, bias=params[0], **kw)
    return cog_attention(q, k, v, **kw)


def _params(weight: Weight) -> list[torch.Tensor]:
    """The tensors the weight takes, (p_score, p_den) slots: tau/bias in the first, beta/eta in
    the second; empty slots hold a tensor nobody reads."""
    return [TAU.clone() if weight in (Weight.ELASTIC, Weight.SIGMOID) else TAU[:0],
            BETA.clone() if weight in (Weight.ELASTIC, Weight.SYMAX) else BETA[:0]]


def _reference(weight: Weight, q, k, v, params, offset: int) -> torch.Tensor:
    """The fp64 composite with the causal mask written out as a bool attn_mask."""
    lq, lk = q.shape[2], k.shape[2]
    mask = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + offset
    p_score = params[0][:, None, None] if params[0].numel() else 1.0
    p_den = params[1][:, None, None] if params[1].numel() else (1.0 if weight is Weight.SOFTMAX1
                                                                else 0.0)
    return composite.attention_composite(weight, q, k, v, p_score=p_score, p_den=p_den, scale=0.5,
                                         causal=False, attn_mask=mask)


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles of a few queries and keys in both fused paths: the diagonal crosses several,
    and with Lq != Lk whole blocks lie above it or see no key."""
    monkeypatch.setattr(native_attention, "BLOCK_Q", 4)
    monkeypatch.setattr(native_attention, "BLOCK_K", 8)
    for name in ("BLOCK_Q", "FAMILY_BLOCK_Q"):
        monkeypatch.setattr(flash, name, 4)
    for name in ("BLOCK_K", "FAMILY_BLOCK_K"):
        monkeypatch.setattr(flash, name, 8)


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("impl", [pytest.param("cpp", marks=pytest.mark.needs("native")),
                                  "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("weight", list(Weight), ids=lambda w: w.name.lower())
def test_both_alignments_match_the_mask_written_out(weight: Weight, dtype: torch.dtype,
                                                    impl: str) -> None:
    """out and every gradient (q, k, v and the weight's parameters) for Lq < Lk and Lq > Lk,
    top-left and bottom-right; at Lq > Lk bottom-right the first Lq - Lk queries see no key
    and give exactly 0 (and dq exactly 0)."""
    g = torch.Generator().manual_seed(int(weight) * 7 + (dtype == torch.bfloat16))
    tol = {"atol": 2e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 4e-2,
                                                                         "rtol": 4e-2}
    for lq, lk in ((5, 29), (29, 5)):
        for align in ("top_left", "bottom_right"):
            offset = causal_offset(align, lq, lk)
            q, k, v = (torch.randn(2, H, n, 8, generator=g).to(dtype) for n in (lq, lk, lk))
            params = _params(weight)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            plist = [p.requires_grad_() for p in params if p.numel()]
            with dispatch.forcing(impl):
                out = _call(weight, *leaves, params, scale=0.5, causal=align)
            do = torch.randn(out.shape, generator=g).to(dtype)
            got = torch.autograd.grad(out, leaves + plist, do)
            ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
            rparams = [p.detach().double().requires_grad_() for p in params]
            want = _reference(weight, *ref, rparams, offset)
            wants = torch.autograd.grad(want, ref + [p for p in rparams if p.numel()],
                                        do.double())
            torch.testing.assert_close(out.double(), want, **tol)
            for mine, theirs in zip(got, wants, strict=True):
                scale = max(1.0, theirs.abs().max().item())  # dk, dtau sum many terms
                torch.testing.assert_close(mine.double() / scale, theirs / scale, **tol)
            if offset < 0:
                blind = -offset
                assert torch.equal(out[:, :, :blind], torch.zeros_like(out[:, :, :blind]))
                assert torch.equal(got[0][:, :, :blind],
                                   torch.zeros_like(got[0][:, :, :blind]))


@pytest.mark.parametrize("weight", [Weight.ELASTIC, Weight.SYMAX], ids=lambda w: w.name.lower())
def test_a_general_mask_takes_the_alignment_to_the_composite(weight: Weight) -> None:
    """A mask that is not key padding (per query) materializes the scores: the alignment
    reaches the composite there too (the mask and the causal diagonal combined)."""
    g = torch.Generator().manual_seed(3)
    lq, lk = 4, 11
    q, k, v = (torch.randn(1, H, n, 8, generator=g, dtype=torch.float64) for n in (lq, lk, lk))
    extra = torch.rand(lq, lk, generator=g) > 0.3
    params = _params(weight)
    got = _call(weight, q, k, v, params, scale=0.5, causal="bottom_right", attn_mask=extra)
    both = extra & (torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + lk - lq)
    p_score = params[0][:, None, None] if params[0].numel() else 0.0
    p_den = params[1][:, None, None] if params[1].numel() else 0.0
    want = composite.attention_composite(weight, q, k, v, p_score=p_score, p_den=p_den, scale=0.5,
                                         causal=False, attn_mask=both)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_decode_step_equals_the_last_row_of_the_full_causal_call() -> None:
    """One query against the cache, bottom-right, is the last row of the full causal call
    over the same keys (what a cache's decode step needs); top-left it would see only key 0."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, H, 40, 16, generator=g) for _ in "qkv")
    full = elastic_attention(q, k, v, tau=TAU, beta=BETA, causal=True)
    step = elastic_attention(q[:, :, -1:], k, v, tau=TAU, beta=BETA, causal="bottom_right")
    torch.testing.assert_close(step, full[:, :, -1:], atol=1e-6, rtol=1e-5)
    first = elastic_attention(q[:, :, -1:], k, v, tau=TAU, beta=BETA, causal="top_left")
    alone = elastic_attention(q[:, :, -1:], k[:, :, :1], v[:, :, :1], tau=TAU, beta=BETA)
    torch.testing.assert_close(first, alone, atol=1e-6, rtol=1e-5)


def test_spellings_and_bad_values() -> None:
    """True and 1 are top-left, False, 0 and None no mask; is_causal takes the same
    spellings; anything else, or causal and is_causal aligned differently, is one
    ValueError naming the allowed values."""
    assert causal_offset(True, 3, 7) == causal_offset("top_left", 3, 7) == causal_offset(1, 3, 7)
    assert causal_offset("bottom_right", 3, 7) == 4
    assert causal_offset("bottom_right", 7, 3) == -4
    assert causal_offset(False, 3, 7) is None and causal_offset(0, 3, 7) is None
    q = torch.randn(1, 1, 3, 4)
    k = torch.randn(1, 1, 5, 4)
    a = elastic_attention(q, k, k, tau=1.0, beta=1.0, is_causal="bottom_right")
    b = elastic_attention(q, k, k, tau=1.0, beta=1.0, causal="bottom_right",
                          is_causal="bottom_right")
    assert torch.equal(a, b)
    for bad in ("bottom-right", "causal", 2, 0.5, "TOP_LEFT"):
        with pytest.raises(ValueError, match="causal must be False, True, 'top_left' or "
                                             "'bottom_right'"):
            elastic_attention(q, k, k, tau=1.0, beta=1.0, causal=bad)
    with pytest.raises(ValueError, match="align the causal mask differently"):
        symax_attention(q, k, k, causal="top_left", is_causal="bottom_right")


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("impl", [pytest.param("cpp", marks=pytest.mark.needs("native")),
                                  "torch"])
@pytest.mark.parametrize("weight", [Weight.ELASTIC, Weight.SYMAX, Weight.STABLEMAX],
                         ids=lambda w: w.name.lower())
def test_an_infinite_key_counts_only_where_the_diagonal_shows_it(weight: Weight,
                                                                 impl: str) -> None:
    """A +inf score (special.py's limit: the mean of the infinite keys' values) at a key
    that bottom-right shows to the later queries only: out and dv as the composite's, the
    earlier queries untouched by it."""
    g = torch.Generator().manual_seed(8)
    lq, lk = 6, 14
    q, k, v = (torch.randn(1, H, n, 8, generator=g, dtype=torch.float64) for n in (lq, lk, lk))
    q[..., 0] = 1.0
    k[:, :, 10, 0] = float("inf")  # seen by queries i with 10 <= i + 8: i >= 2
    k[:, :, 10, 1:] = 0.0
    params = _params(weight)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with dispatch.forcing(impl):
        out = _call(weight, *leaves, params, scale=0.5, causal="bottom_right")
    (dv,) = torch.autograd.grad(out, leaves[2], torch.ones_like(out))
    want = _reference(weight, q, k, v, params, lk - lq)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
    assert torch.equal(out[:, :, 2:], v[:, :, 10:11].expand(-1, -1, lq - 2, -1))
    assert torch.equal(dv[:, :, 10], torch.full_like(dv[:, :, 10], lq - 2.0))
