"""The Triton attention kernels' Cog weight (Weight.COG, docs/attention.md sections 7 and 9):
w_ij = sign(s_ij) exp(|s_ij| - m_i) / den_i, m_i = max |s| over the visible keys, den_i =
sum exp(|s| - m_i), forward and backward under Triton's interpreter against the formula
written out in fp64 here: causal top-left and bottom-right, key padding, zero scores, ties,
infinite and NaN scores, fp32, fp16 and bf16.

The interpreter must be on before `triton.jit` decorates the kernels, so an ordinary run
re-runs this module in a child pytest with TRITON_INTERPRET=1 (tests/conftest.py)."""

from __future__ import annotations

import math

import pytest
import torch

from elasticbench import devices

pytestmark = pytest.mark.needs("triton")

SCALE = 0.3


def cog_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                  scale: float, visible: torch.Tensor) -> dict[str, torch.Tensor]:
    """Cog attention in fp64 from the paper's formula: out, m, den, and the gradients from
    ds = p g - w c (p = |w|; at a zero score p g), dq = scale ds k, dk = scale ds^T q, dv =
    w^T dO. A query with an infinite |s| takes the limit, sign(s)/n on its n infinite
    scores, m = +inf, den = n, and ds = 0; one with no visible key 0 (m = 0, den = 0).
    visible: bool, broadcasting to (batch, heads, length_q, length_k)."""
    q, k, v, do = (t.double() for t in (q, k, v, do))
    s = scale * q @ k.transpose(-1, -2)
    visible = visible.expand(s.shape)
    a = s.abs()
    m = a.masked_fill(~visible, -math.inf).amax(-1, keepdim=True)
    m = torch.where(visible.any(-1, keepdim=True), m, 0.0)
    hits = visible & (a == math.inf)
    infinite = hits.any(-1, keepdim=True)
    shifted = torch.where(infinite, 0.0, a - torch.where(infinite, 0.0, m))
    e = torch.where(visible & ~infinite, torch.exp(shifted), 0.0)
    den = e.sum(-1, keepdim=True)
    p = e / torch.where(den == 0, 1.0, den)
    w = torch.where(visible, torch.sign(s) * p, 0.0)
    n = hits.sum(-1, keepdim=True)
    w = torch.where(infinite, torch.where(hits, torch.sign(s), 0.0) / n.clamp_min(1), w)
    den = torch.where(infinite, n.double(), den)
    out = w @ v
    g = do @ v.transpose(-1, -2)
    c = (do * out).sum(-1, keepdim=True)
    ds = torch.where(infinite, 0.0, p * g - w * c)
    return {"out": out, "m": m[..., 0], "den": den[..., 0], "dq": scale * ds @ k,
            "dk": scale * ds.transpose(-1, -2) @ q, "dv": w.transpose(-1, -2) @ do}


def test_the_reference_gradient_is_autograd_of_the_formula_off_zero_scores() -> None:
    """The reference's ds = p g - w c is autograd of sign(s) exp(|s|) / sum exp(|s|) where no
    score is 0 (causal, so that hidden keys are in it too)."""
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64)
                   for _ in range(4))
    visible = torch.arange(9)[None, :] <= torch.arange(9)[:, None]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    s = SCALE * leaves[0] @ leaves[1].transpose(-1, -2)
    e = torch.exp(s.abs()).masked_fill(~visible, 0.0)
    out = (torch.sign(s) * e / e.sum(-1, keepdim=True)) @ leaves[2]
    grads = torch.autograd.grad(out, leaves, do)
    want = cog_reference(q, k, v, do, SCALE, visible)
    torch.testing.assert_close(want["out"], out.detach())
    for name, got in zip(("dq", "dk", "dv"), grads, strict=True):
        torch.testing.assert_close(want[name], got, msg=name)


if not devices.triton_interpreted():

    @pytest.mark.ci  # a child pytest under the interpreter: about 30 s of a core
    def test_cog_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__)

else:
    from elasticbench.attention.weights import Weight
    from elasticbench.kernels.triton.attention_configs import Tiles
    from elasticbench.kernels.triton.flash_attention import attention_backward, attention_forward

    SMALL = Tiles(16, 16, 4, 1)  # several key and query blocks at these lengths
    # the largest error allowed, relative to the largest reference element: fp32, and the
    # 16-bit formats (p and ds rounded once to them for the second products)
    REL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

    def _run(q, k, v, do, causal, offset=0, key_mask=None, tile=SMALL, scale=SCALE):
        """out, m, den, dq, dk, dv and the two parameters' gradients of the Triton kernels;
        p_score and p_den are ignored by Cog (7.0 here)."""
        ignored = torch.full(q.shape[:2], 7.0)
        out, m, den = attention_forward(q, k, v, ignored, ignored, scale, causal, key_mask,
                                        Weight.COG, tile, offset)
        grads = attention_backward(q, k, v, out, do, m, den, ignored, ignored, scale, causal,
                                   key_mask, Weight.COG, None if tile is None else (tile, tile),
                                   offset)
        return dict(zip(("out", "m", "den", "dq", "dk", "dv", "dp_score", "dp_den"),
                        (out, m, den, *grads), strict=True))

    def _visible(lq, lk, causal, offset, key_mask):
        vis = torch.ones(1, 1, lq, lk, dtype=torch.bool)
        if causal:
            vis = vis & (torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + offset)
        if key_mask is not None:
            vis = vis & key_mask[:, None, None, :]
        return vis

    def _close(got, want, rel, names=("out", "m", "den", "dq", "dk", "dv")):
        for name in names:
            a, b = got[name].double(), want[name]
            scale = max(float(b.abs().max()), 1e-30) if b.numel() else 1.0
            err = float((a - b).abs().max()) if b.numel() else 0.0
            assert err <= rel * scale, (name, err, scale)

    @pytest.mark.parametrize(("dtype", "lq", "lk", "align", "padded", "tile"), [
        (torch.float32, 17, 17, None, False, SMALL),
        (torch.float32, 64, 64, "top_left", True, SMALL),
        (torch.float32, 17, 64, "bottom_right", False, SMALL),
        (torch.float32, 64, 17, "bottom_right", True, SMALL),  # leading queries see no key
        (torch.float32, 1, 17, "bottom_right", False, None),  # a decode step, default tiles
        (torch.float32, 1, 1, "top_left", False, None),
        (torch.float16, 64, 64, "top_left", False, SMALL),
        (torch.bfloat16, 17, 64, "bottom_right", True, SMALL),
    ], ids=lambda x: str(x).removeprefix("torch.") if not isinstance(x, Tiles) else "small")
    def test_cog_forward_and_backward_match_the_formula(dtype, lq, lk, align, padded, tile):
        """out, m, den, dq, dk, dv against the fp64 formula of the rounded inputs; p_score and p_den
        ignored with zero gradients; a query that sees no key gives exactly 0."""
        g = torch.Generator().manual_seed(lq * 100 + lk)
        q, do = (torch.randn(1, 2, lq, 16, generator=g).to(dtype) for _ in range(2))
        k, v = (torch.randn(1, 2, lk, 16, generator=g).to(dtype) for _ in range(2))
        q[0, 0] *= 4  # large |s|: the running max moves
        causal = align is not None
        offset = lk - lq if align == "bottom_right" else 0
        key_mask = None
        if padded:
            key_mask = torch.ones(1, lk, dtype=torch.bool)
            key_mask[0, 3] = False
            key_mask[0, lk - 5:] = False
            k[0, :, 3] = float("nan")  # a padded key does not exist: its NaN changes nothing
        got = _run(q, k, v, do, causal, offset, key_mask, tile)
        vis = _visible(lq, lk, causal, offset, key_mask)
        want = cog_reference(q, k.masked_fill(k.isnan(), 0.0), v, do, SCALE, vis)
        _close(got, want, REL[dtype])
        assert not got["dp_score"].any() and not got["dp_den"].any()
        blind = ~vis.any(-1)[0, 0]
        if blind.any():
            assert not got["out"][:, :, blind].any() and not got["dq"][:, :, blind].any()
            assert not got["m"][:, :, blind].any() and not got["den"][:, :, blind].any()
        if padded:
            assert not got["dk"][0, :, 3].any() and not got["dv"][0, :, lk - 5:].any()

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_zero_scores_and_ties_follow_the_formula(dtype):
        """A query whose scores are all 0 (w = 0, den = the visible count, ds = g / n), a key
        whose scores are all 0 (weight 0 but in every denominator), and ties of |s| of both
        signs (a key repeated and negated, in another key block), causal."""
        g = torch.Generator().manual_seed(3)
        q, do = (torch.randn(1, 2, 40, 16, generator=g).to(dtype) for _ in range(2))
        k, v = (torch.randn(1, 2, 40, 16, generator=g).to(dtype) for _ in range(2))
        q[0, :, 20] = 0.0
        k[0, :, 5] = 0.0
        k[0, :, 30] = k[0, :, 2]
        k[0, :, 33] = -k[0, :, 2]
        q[0, 0, 35] = k[0, 0, 2] * 3  # query 35's maximum |s|: keys 2, 30 and 33, +, +, -
        got = _run(q, k, v, do, True)
        want = cog_reference(q, k, v, do, SCALE, _visible(40, 40, True, 0, None))
        _close(got, want, REL[dtype])
        assert not got["out"][:, :, 20].any()
        assert torch.equal(got["den"][:, :, 20], torch.full((1, 2), 21.0))

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    def test_infinite_and_nan_scores(dtype):
        """Query 7: +inf and -inf scores on every key it sees (q's +inf against k's +-1): the
        mean of sign(s) v, m = +inf, den = the count, dq 0, dv its signed share; query 25 a
        NaN: its out, m, den and dq NaN, and the dk and dv of every key it sees; the other
        queries as the formula (dk leaves out the infinite query: 0 * inf)."""
        g = torch.Generator().manual_seed(4)
        q, do = (torch.randn(1, 2, 40, 16, generator=g).to(dtype) for _ in range(2))
        k, v = (torch.randn(1, 2, 40, 16, generator=g).to(dtype) for _ in range(2))
        k[0, 0, :, 0] = torch.where(torch.arange(40) % 3 == 0, -1.0, 1.0).to(dtype)
        q[0, 0, 7, 0] = float("inf")
        got = _run(q, k, v, do, True)
        vis = _visible(40, 40, True, 0, None)
        want = cog_reference(q, k, v, do, SCALE, vis)
        assert got["m"][0, 0, 7] == math.inf and got["den"][0, 0, 7] == 8
        assert not got["dq"][0, 0, 7].any()
        _close(got, want, REL[dtype], ("out", "dq", "dv"))
        finite = torch.ones(40, dtype=torch.bool)
        finite[7] = False
        for name in ("m", "den"):
            a, b = got[name][:, :, finite].double(), want[name][:, :, finite]
            assert float((a - b).abs().max()) <= REL[dtype] * float(b.abs().max()), name
        # the NaN query; the clean reference gives it q = 0 and dO = 0
        q2, do2 = q.clone(), do.clone()
        q[0, 1, 25, 3] = float("nan")
        q2[0, 1, 25], do2[0, 1, 25] = 0.0, 0.0
        got = _run(q, k, v, do2, True)
        want = cog_reference(q2, k, v, do2, SCALE, vis)
        for name in ("out", "dq"):
            assert got[name][0, 1, 25].isnan().all(), name
            assert got[name][0, 0].isfinite().all(), name
        assert got["m"][0, 1, 25].isnan() and got["den"][0, 1, 25].isnan()
        assert got["dk"][0, 1, :26].isnan().all() and got["dv"][0, 1, :26].isnan().all()
        others = torch.arange(40) != 25
        a, b = got["dq"][0, 1, others].double(), want["dq"][0, 1, others]
        assert float((a - b).abs().max()) <= REL[dtype] * float(b.abs().max())

    def test_a_maximum_whose_exponent_overflows_takes_the_limit():
        """|s| = 3e38 is finite but m log2(e) is not (scale 1): the query is finished as an
        infinite one, sign(s)/n on the scores at its maximum (a tie of + and -), as the
        formula's weights are there (every other exp(|s| - m) is 0); m is the maximum."""
        g = torch.Generator().manual_seed(5)
        q, do = (torch.randn(1, 1, 8, 4, generator=g) for _ in range(2))
        k, v = (torch.randn(1, 1, 20, 4, generator=g) for _ in range(2))
        k[0, 0, :, 0] = 0.5
        k[0, 0, [4, 17], 0], k[0, 0, 9, 0] = 1.0, -1.0
        k[0, 0, :, 1:] = 0.0
        q[0, 0, 3] = torch.tensor([3e38, 0.0, 0.0, 0.0])
        got = _run(q, k, v, do, False, scale=1.0)
        want = cog_reference(q, k, v, do, 1.0, torch.ones(1, 1, 8, 20, dtype=torch.bool))
        assert got["den"][0, 0, 3] == 3 and want["den"][0, 0, 3] == 3
        assert got["m"][0, 0, 3] == q[0, 0, 3, 0] == want["m"][0, 0, 3]
        torch.testing.assert_close(got["out"].double(), want["out"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["out"][0, 0, 3], (v[0, 0, 4] + v[0, 0, 17] - v[0, 0, 9]) / 3)

    def test_tensor_descriptors_give_the_pointer_loads_bits():
        """A TMA configuration against the same tiles with pointer loads: out, m, den and
        the gradients bit for bit (bf16, causal, an odd key length, key padding whose padded
        keys hold NaN and inf)."""
        from dataclasses import replace

        from elasticbench.kernels.triton import attention_configs as ac

        if not ac.tma_available():
            pytest.skip("this Triton has no tensor descriptors")
        g = torch.Generator().manual_seed(6)
        q, do = (torch.randn(1, 2, 33, 16, generator=g).bfloat16() for _ in range(2))
        k, v = (torch.randn(1, 2, 37, 16, generator=g).bfloat16() for _ in range(2))
        key_mask = torch.ones(1, 37, dtype=torch.bool)
        key_mask[0, [3, 30]] = False
        for t in (k, v):
            t[0, :, 3], t[0, :, 30] = float("nan"), float("inf")
        runs = [_run(q, k, v, do, True, 4, key_mask, replace(SMALL, tma=tma))
                for tma in (False, True)]
        for name, a in runs[0].items():
            assert torch.equal(a.view(torch.uint8), runs[1][name].view(torch.uint8)), name
        assert runs[0]["out"].isfinite().all(), "padded keys seen"
