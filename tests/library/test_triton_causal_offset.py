"""The Triton attention kernels' causal offset (query i sees key j iff j <= i + offset):
top-left (0) and bottom-right (length_k - length_q) for length_q below and above
length_k, every weight, forward and backward, under Triton's interpreter against the
composite reference with the same mask written out (docs/attention.md section 1).

The interpreter must be on before `triton.jit` decorates the kernels, so an ordinary run
re-runs this module in a child pytest with TRITON_INTERPRET=1 (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from elasticbench import devices
from elasticbench.attention.weights import Weight

pytestmark = pytest.mark.needs("triton")

# (length_q, length_k, (block_m, block_n)): blocks wholly above the diagonal skipped,
# unmasked blocks below it, ragged ends, resident and streamed blocks of different sizes
SHAPES = [(3, 70, (32, 16)), (70, 3, (16, 32)), (24, 40, (16, 16)), (45, 20, (32, 16))]


def _params(weight: Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_score, p_den) in fp64: per head where the weight reads them."""
    p_score = torch.tensor([0.7, 1.3], dtype=torch.float64)
    p_den = torch.tensor([0.5, 2.0], dtype=torch.float64)
    if weight not in (Weight.ELASTIC, Weight.SIGMOID):
        p_score = torch.tensor(1.0, dtype=torch.float64)
    if weight not in (Weight.ELASTIC, Weight.SYMAX):
        p_den = torch.tensor(1.0 if weight is Weight.SOFTMAX1 else 0.0, dtype=torch.float64)
    return p_score, p_den


if not devices.triton_interpreted():

    @pytest.mark.ci  # a child pytest under the interpreter: 80-110 s of a core
    def test_causal_offsets_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__)

else:

    @pytest.mark.parametrize("weight", list(Weight), ids=lambda w: w.name.lower())
    @pytest.mark.parametrize("align", ["top_left", "bottom_right"])
    def test_every_weight_honours_the_causal_offset(weight: Weight, align: str) -> None:
        """out, dq, dk, dv and the parameters' gradients against autograd through the fp64
        composite under the mask j <= i + offset; a query that sees no key (bottom-right,
        length_q > length_k) gives 0 and zero gradients."""
        from elasticbench.attention.composite import attention_composite
        from elasticbench.kernels.triton.attention_configs import Tiles
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        g = torch.Generator().manual_seed(5)
        p_score, p_den = _params(weight)
        for lq, lk, blocks in SHAPES:
            offset = 0 if align == "top_left" else lk - lq
            q, k, v, do = (torch.randn(1, 2, n, 16, generator=g, dtype=torch.float64)
                           for n in (lq, lk, lk, lq))
            mask = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + offset
            leaves = [t.clone().requires_grad_() for t in (q, k, v, p_score, p_den)]
            want = attention_composite(weight, *leaves[:3], p_score=leaves[3], p_den=leaves[4],
                                       scale=0.4, causal=False, attn_mask=mask)
            grads = torch.autograd.grad(want, leaves, do, allow_unused=True)
            t = Tiles(*blocks, 4, 1)
            f32 = [x.float() for x in (q, k, v, p_score, p_den, do)]
            out, m, den = attention_forward(*f32[:5], 0.4, True, weight=weight, tile=t,
                                            offset=offset)
            got = attention_backward(*f32[:3], out, f32[5], m, den, *f32[3:5], 0.4, True,
                                     weight=weight, tiles=(t, t), offset=offset)
            torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
            for mine, ref in zip(got[:3], grads[:3], strict=True):
                torch.testing.assert_close(mine.double(), ref, atol=5e-5, rtol=1e-4)
            for mine, ref, p in zip(got[3:], grads[3:], (p_score, p_den), strict=True):
                if ref is not None and p.ndim == 1:  # per head: summed over the batch
                    torch.testing.assert_close(mine.double().sum(0), ref, atol=5e-5,
                                               rtol=1e-4)
            if offset < 0:  # queries 0 .. -offset-1 see no key
                blind = -offset
                assert torch.equal(out[:, :, :blind], torch.zeros_like(out[:, :, :blind]))
                assert torch.equal(got[0][:, :, :blind], torch.zeros_like(got[0][:, :, :blind]))

    @pytest.mark.parametrize("weight", [Weight.ELASTIC, Weight.SYMAX],
                             ids=lambda w: w.name.lower())
    def test_bottom_right_is_top_left_after_leading_queries(weight: Weight) -> None:
        """Special values included (a +inf key: the saturated pass; a NaN key), bottom-right
        at length_q < length_k equals top-left over length_k queries whose first ones are
        extra queries with dO = 0, and at length_q > length_k top-left over extra leading
        keys hidden by a key-padding mask: the same outputs (bit for bit in the first), the same NaN
        places, gradients equal where finite (the tiles group the keys differently)."""
        from elasticbench.kernels.triton.attention_configs import Tiles
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        def run(q, k, v, do, key_mask, offset):
            t = Tiles(16, 32, 4, 1)
            out, m, den = attention_forward(q, k, v, p_score, p_den, 0.4, True, key_mask,
                                            weight=weight, tile=t, offset=offset)
            return (out, *attention_backward(q, k, v, out, do, m, den, p_score, p_den, 0.4, True,
                                             key_mask, weight=weight, tiles=(t, t),
                                             offset=offset))

        g = torch.Generator().manual_seed(6)
        p_score, p_den = (p.float() for p in _params(weight))
        for lq, lk in ((20, 45), (45, 20)):
            q, k, v, do = (torch.randn(1, 2, n, 16, generator=g) for n in (lq, lk, lk, lq))
            k[0, 1, lk // 2] = float("inf")
            k[0, 0, -1] = float("nan")
            got = run(q, k, v, do, None, lk - lq)
            n = abs(lk - lq)
            if lq < lk:
                extra = torch.randn(1, 2, n, 16, generator=g)
                want = run(torch.cat((extra, q), 2), k, v, torch.cat((0 * extra, do), 2),
                           None, 0)
                want = (want[0][:, :, n:], want[1][:, :, n:], *want[2:])
            else:
                extra_k, extra_v = (torch.randn(1, 2, n, 16, generator=g) for _ in "kv")
                keep = (torch.arange(lq) >= n)[None]
                want = run(q, torch.cat((extra_k, k), 2), torch.cat((extra_v, v), 2), do,
                           keep, 0)
                want = (*want[:2], want[2][:, :, n:], want[3][:, :, n:], *want[4:])
            assert torch.equal(got[0].isnan(), want[0].isnan())
            # the same key tiles where only queries were added: the same bits
            exact = lq < lk
            torch.testing.assert_close(got[0], want[0], atol=0 if exact else 1e-6,
                                       rtol=0 if exact else 1e-5, equal_nan=True)
            for mine, ref in zip(got[1:], want[1:], strict=True):
                both = mine.isfinite() & ref.isfinite()
                torch.testing.assert_close(mine[both], ref[both], atol=2e-6, rtol=1e-5)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
    def test_the_library_takes_the_alignment_to_the_triton_kernel(dtype) -> None:
        """elasticbench.functional with causal="bottom_right" on the Triton implementation
        (forced) gives the tiled torch code's out and gradients, per-head parameters read
        in place."""
        from elasticbench import dispatch
        from elasticbench.functional import elastic_attention

        g = torch.Generator().manual_seed(7)
        results = []
        for impl in ("triton", "torch"):
            g.manual_seed(7)
            q, k, v = (torch.randn(1, 2, n, 16, generator=g).to(dtype).requires_grad_()
                       for n in (3, 37, 37))
            tau = torch.tensor([0.6, 1.2], requires_grad=True)
            beta = torch.tensor([0.5, 2.0], requires_grad=True)
            with dispatch.forcing(impl):
                out = elastic_attention(q, k, v, tau=tau, beta=beta, causal="bottom_right")
            results.append((out, *torch.autograd.grad(out, (q, k, v, tau, beta),
                                                      torch.ones_like(out))))
        tol = 2e-5 if dtype == torch.float32 else 2e-2
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)
