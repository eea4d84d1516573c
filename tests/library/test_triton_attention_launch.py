"""How the Triton attention kernels are launched (kernels/triton/flash_attention.py): strided
q, k, v, dO and outputs with no copy, parameters read in place, one no-mask placeholder per
device, the device guard, the capability cache, TMA's 16-byte rules on the actual strides,
the one-dimensional grid, and fp16 gradients at a small tau (docs/attention.md section 7).

The host-side tests run here with the launch replaced by a recorder; the numerical ones
need Triton's interpreter on before the kernels are decorated, so one test re-runs this
module with TRITON_INTERPRET=1 (as tests/library/test_triton_attention.py does)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from elasticbench import devices

pytestmark = pytest.mark.needs("triton")


def _heads_last(b: int, length: int, h: int, d: int, dtype: torch.dtype, gen: torch.Generator,
                parts: int = 1, part: int = 0) -> torch.Tensor:
    """A (b, h, length, d) view of a (b, length, parts h, d) tensor, as a fused projection's
    output split into heads and transposed: its heads part `part`, no copy."""
    x = torch.randn(b, length, parts * h, d, generator=gen).to(dtype)
    return x[:, :, part * h:(part + 1) * h].transpose(1, 2)


if not devices.triton_interpreted():

    @pytest.mark.ci  # a child pytest under the interpreter: 25-40 s of a core
    def test_launches_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__)

    @pytest.fixture
    def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
        """The launches the wrappers make, recorded instead of run: (kernel name, grid,
        args)."""
        from elasticbench.kernels.triton import flash_attention

        calls: list[tuple] = []
        monkeypatch.setattr(flash_attention, "run", lambda kernel, grid, args, *rest, **kw:
                            calls.append((kernel.fn.__name__, grid, args)))
        return calls

    def test_transposed_views_reach_every_launch_without_a_copy(recorded) -> None:
        """q, k, v (heads of fused projections, transposed), out and dO (transposed) reach
        the forward and the three backward launches as the caller's memory, with their
        strides; the parameters as the caller's tensors (a per-head fp16 tensor broadcast by
        a batch stride of 0, a 0-d one by two)."""
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        g = torch.Generator().manual_seed(1)
        b, h, lq, lk, d = 2, 3, 20, 12, 16
        q = _heads_last(b, lq, h, d, torch.bfloat16, g, parts=3, part=0)
        k = _heads_last(b, lk, h, d, torch.bfloat16, g, parts=2, part=1)
        v = _heads_last(b, lk, h, d, torch.bfloat16, g)
        tau = torch.tensor([0.5, 0.7, 0.9], dtype=torch.float16)
        beta = torch.tensor(1.5)
        attention_forward(q, k, v, tau, beta, 0.25, True)
        (name, grid, args), = recorded
        assert name == "attention_forward_kernel" and grid == (args[-1], b * h)  # (blocks, b h)
        assert [a.data_ptr() for a in args[:3]] == [t.data_ptr() for t in (q, k, v)]
        assert args[10:19] == (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
        assert args[6].data_ptr() == tau.data_ptr()
        assert args[6].dtype == torch.float16 and args[19:23] == (0, 1, 0, 0)
        assert args[7].data_ptr() == beta.data_ptr()
        out = _heads_last(b, lq, h, d, torch.bfloat16, g)
        do = _heads_last(b, lq, h, d, torch.bfloat16, g)
        m = torch.zeros(b, h, lq)
        recorded.clear()
        attention_backward(q, k, v, out, do, m, m + 1, tau, beta, 0.25, True)
        names = [c[0] for c in recorded]
        assert names == ["attention_prepare_kernel", "attention_dkdv_kernel",
                         "attention_dq_kernel"]
        prep, dkdv, dq = (c[2] for c in recorded)
        assert [a.data_ptr() for a in prep[:2]] == [out.data_ptr(), do.data_ptr()]
        assert prep[9:15] == (*out.stride()[:3], *do.stride()[:3])
        for args, at in ((dkdv, 12), (dq, 11)):
            assert [a.data_ptr() for a in args[:4]] == [t.data_ptr()
                                                        for t in (q, k, v, do)]
            assert args[at:at + 12] == tuple(s for t in (q, k, v, do) for s in t.stride()[:3])

    def test_a_last_dimension_that_is_not_contiguous_is_copied(recorded) -> None:
        from elasticbench.kernels.triton.flash_attention import attention_forward

        q = torch.randn(1, 2, 8, 16).transpose(2, 3)  # (1, 2, 16, 8): columns 8 apart
        attention_forward(q, q, q, torch.ones(1, 2), torch.ones(1, 2), 0.25, False)
        args = recorded[0][2]
        assert args[0].is_contiguous() and torch.equal(args[0], q)
        assert args[0].data_ptr() != q.data_ptr()

    def test_the_no_mask_placeholder_is_made_once_per_device(recorded) -> None:
        from elasticbench.kernels.triton.flash_attention import attention_forward

        q = torch.randn(1, 1, 8, 16)
        for _ in range(2):
            attention_forward(q, q, q, 0.5, 1.0, 0.25, False)
        first, second = (c[2][8:10] for c in recorded)
        assert first[0] is second[0] and first[1] is second[1]

    @pytest.mark.parametrize(("shape", "strides"), [
        ((), (0, 0)), ((3,), (0, 1)), ((2, 3), (3, 1)), ((2, 3, 1, 1), (3, 1)),
        ((2, 1), (1, 0))])
    def test_parameters_are_read_through_batch_and_head_strides(shape, strides) -> None:
        from elasticbench.kernels.triton.flash_attention import _param

        p = torch.arange(float(torch.Size(shape).numel())).reshape(shape).half()
        view, sb, sh = _param(p, 2, 3, torch.device("cpu"), "p_score")
        assert (sb, sh) == strides and view.data_ptr() == p.data_ptr()
        assert view.dtype == torch.float16 and view.shape == (2, 3)

    def test_a_parameter_that_does_not_broadcast_is_refused_in_one_line() -> None:
        from elasticbench.kernels.triton.flash_attention import attention_forward

        q = torch.randn(2, 3, 8, 16)
        with pytest.raises(ValueError, match=r"p_den must broadcast to \(batch, heads\) = "
                                             r"\(2, 3\), got shape \(2,\)$"):
            attention_forward(q, q, q, 0.5, torch.ones(2), 0.25, False)

    def test_the_grid_keeps_a_heads_blocks_together_and_takes_millions_of_heads() -> None:
        """Up to 65535 (batch, head) pairs the grid is (blocks, b h): one head's blocks run
        side by side and share its keys and values in L2; past that b h moves to the x axis
        (up to 2^31 - 1), the kernels told so by BH_X; more is refused in one line."""
        from elasticbench.kernels.triton.flash_attention import GRID_X, GRID_Y, bh_on_x, grid

        assert grid(128, 64) == (128, 64) and not bh_on_x(64)
        assert grid(3, GRID_Y) == (3, GRID_Y) and not bh_on_x(GRID_Y)
        assert grid(1, 65536) == (65536, 1) and bh_on_x(65536)
        assert grid(128, 4_000_000) == (4_000_000, 128)
        assert grid(GRID_Y, GRID_X) == (GRID_X, GRID_Y)
        for blocks, bh in ((GRID_Y + 1, 1), (1, GRID_X + 1)):
            with pytest.raises(ValueError, match=r"at most 2147483647 \(batch, head\) pairs and "
                                                 "65535 blocks"):
                grid(blocks, bh)

    def test_tma_is_taken_only_where_the_actual_strides_allow_it(monkeypatch) -> None:
        """TMA's 16-byte rules on each (batch, head)'s base and on the row stride: a
        transposed view whose rows are 16-byte multiples takes it; a head slice at an odd
        element offset, or rows 2 bytes past a multiple of 16, fall back to pointer loads."""
        from elasticbench.kernels.triton import flash_attention

        monkeypatch.setattr(flash_attention, "tma_available", lambda: True)
        g = torch.Generator().manual_seed(2)
        fused = torch.randn(2, 8, 4 * 16, dtype=torch.bfloat16)
        heads = fused.view(2, 8, 4, 16).transpose(1, 2)
        assert flash_attention._tma_ok(heads, heads.contiguous())
        odd = torch.randn(2, 8, 4 * 16 + 1, generator=g).to(torch.bfloat16)[:, :, 1:]
        assert not flash_attention._tma_ok(odd.reshape(2, 8, 4, 16).transpose(1, 2))
        ragged = torch.randn(2, 8, 4, 17, generator=g).to(torch.bfloat16)[..., :16]
        assert not flash_attention._tma_ok(ragged.transpose(1, 2))  # heads 34 bytes apart
        wide = torch.randn(2, 3, 8, 24, generator=g).to(torch.bfloat16)[..., :16]
        assert flash_attention._tma_ok(wide)  # rows 48 bytes apart

    def test_the_capability_is_looked_up_once_per_device(monkeypatch) -> None:
        from elasticbench.kernels.triton import flash_attention

        asked: list[torch.device] = []

        def capability(device: torch.device) -> tuple[int, int]:
            asked.append(device)
            return (9, 0)

        monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
        flash_attention._capability.cache_clear()
        try:
            for _ in range(3):
                assert flash_attention._capability(torch.device("cuda", 3)) == (9, 0)
            assert asked == [torch.device("cuda", 3)]
        finally:
            flash_attention._capability.cache_clear()

    def test_the_device_guard_switches_only_off_the_current_device(monkeypatch) -> None:
        from elasticbench.kernels.triton import flash_attention

        class OnCuda:
            is_cuda = True

            def __init__(self, index: int) -> None:
                self.device = torch.device("cuda", index)

        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        assert isinstance(flash_attention._on_device(OnCuda(0)), contextlib.nullcontext)
        guard = flash_attention._on_device(OnCuda(1))
        assert isinstance(guard, torch.cuda.device) and guard.idx == 1
        assert isinstance(flash_attention._on_device(torch.zeros(1)), contextlib.nullcontext)

else:
    from elasticbench.attention.weights import Weight
    from elasticbench.kernels.triton.flash_attention import attention_backward, attention_forward

    def _both(q, k, v, do, p_score, p_den, causal, mask=None, weight=Weight.ELASTIC):
        out = attention_forward(q, k, v, p_score, p_den, 0.3, causal, mask, weight)
        return (*out, *attention_backward(q, k, v, out[0], do, out[1], out[2], p_score, p_den, 0.3,
                                          causal, mask, weight))

    def _same_bits(got, want) -> None:
        names = ("out", "m", "den", "dq", "dk", "dv", "dp_score", "dp_den")
        for name, a, b in zip(names, got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert torch.equal(a.contiguous().view(torch.uint8), b.view(torch.uint8)), name

    @pytest.mark.parametrize(("dtype", "weight"), [(torch.bfloat16, Weight.ELASTIC),
                                                   (torch.float32, Weight.SYMAX)])
    def test_transposed_views_give_the_contiguous_results_bit_for_bit(dtype, weight) -> None:
        """Heads of fused (batch, length, heads, dim) projections, transposed, against the
        same values made contiguous: out, m, den and the five gradients bit-identical, on 3
        x 2 (batch, head) pairs of 2-3 blocks each (the grid's order), causal with key
        padding."""
        g = torch.Generator().manual_seed(3)
        b, h, lq, lk, d = 3, 2, 40, 33, 16
        q = _heads_last(b, lq, h, d, dtype, g, parts=3, part=0)
        k = _heads_last(b, lk, h, d, dtype, g, parts=3, part=1)
        v = _heads_last(b, lk, h, d, dtype, g, parts=3, part=2)
        do = _heads_last(b, lq, h, d, dtype, g)
        mask = torch.arange(lk)[None, :] < torch.tensor([[lk], [20], [30]])
        p_score = torch.rand(b, h, generator=g) + 0.2
        p_den = torch.rand(b, h, generator=g)
        got = _both(q, k, v, do, p_score, p_den, True, mask, weight)
        want = _both(*(t.contiguous() for t in (q, k, v, do)), p_score, p_den, True, mask, weight)
        _same_bits(got, want)
        assert got[0].isfinite().all() and got[3].isfinite().all()

    def test_64_bit_row_offsets_give_the_same_bits(monkeypatch) -> None:
        """WIDE (a row offset that may pass 2^31, _row_stride) forced on a small transposed
        call: out, m, den and the five gradients bit-identical to the 32-bit offsets."""
        from elasticbench.kernels.triton import flash_attention

        g = torch.Generator().manual_seed(6)
        q, k, v, do = (_heads_last(1, 24, 2, 16, torch.bfloat16, g) for _ in range(4))
        tau, beta = torch.tensor([0.4, 0.8]), torch.tensor(1.0)
        want = _both(q, k, v, do, tau, beta, True)
        monkeypatch.setattr(flash_attention, "_wide", lambda *tensors: True)
        _same_bits(_both(q, k, v, do, tau, beta, True), want)

    def test_batch_heads_on_the_x_axis_give_the_same_bits(monkeypatch) -> None:
        """The grid past 65535 (batch, head) pairs, (b h, blocks) with BH_X, forced on 3 x 2
        pairs by lowering the y axis's limit: out, m, den and the five gradients bit-identical
        to the (blocks, b h) grid, causal with key padding."""
        from elasticbench.kernels.triton import flash_attention

        g = torch.Generator().manual_seed(8)
        q, k, v, do = (_heads_last(3, 40, 2, 16, torch.bfloat16, g) for _ in range(4))
        mask = torch.arange(40)[None, :] < torch.tensor([[40], [21], [33]])
        tau, beta = torch.rand(3, 2, generator=g) + 0.2, torch.tensor(0.5)
        want = _both(q, k, v, do, tau, beta, True, mask)
        monkeypatch.setattr(flash_attention, "GRID_Y", 5)
        assert flash_attention.bh_on_x(6) and flash_attention.grid(3, 6) == (6, 3)
        _same_bits(_both(q, k, v, do, tau, beta, True, mask), want)

    def test_tensor_descriptors_take_the_strides_of_a_transposed_view() -> None:
        """The TMA form on heads of a fused projection, transposed (descriptors built on each
        (batch, head)'s base with the view's row stride): the pointer loads' bits."""
        from dataclasses import replace

        from elasticbench.kernels.triton import attention_configs as ac

        if not ac.tma_available():
            pytest.skip("this Triton has no tensor descriptors")
        g = torch.Generator().manual_seed(9)
        q, k, v, do = (_heads_last(2, 40, 2, 16, torch.bfloat16, g, parts=4, part=i)
                       for i in range(4))
        tau, beta = torch.tensor([[0.3, 0.7], [1.1, 0.5]]), torch.ones(2, 2)
        tiles = [ac.smallest(ac.configs(kernel, 16, torch.bfloat16, True, Weight.ELASTIC))
                 for kernel in ac.KERNELS]
        results = []
        for tma in (False, True):
            fwd, kv, dq = (replace(t, tma=tma) for t in tiles)
            out = attention_forward(q, k, v, tau, beta, 0.3, True, None, Weight.ELASTIC, fwd)
            results.append([*out, *attention_backward(q, k, v, out[0], do, out[1], out[2], tau,
                                                      beta, 0.3, True, None, Weight.ELASTIC,
                                                      (kv, dq))])
        _same_bits(*results)

    def test_every_parameter_form_gives_the_results_of_a_batch_head_tensor() -> None:
        """tau and beta as a float, a 0-d, (heads,), (batch, heads), (batch, heads, 1, 1)
        or fp16 tensor, a (batch, heads) view with a batch stride of 0: the results of the
        contiguous (batch, heads) fp32 tensors the wrapper formed from them before, bit for
        bit (the gradients per (batch, head) in every case)."""
        g = torch.Generator().manual_seed(4)
        b, h, lq, d = 2, 3, 16, 16
        q, k, v, do = (torch.randn(b, h, lq, d, generator=g).to(torch.bfloat16)
                       for _ in range(4))
        tau_h, beta_h = torch.tensor([0.25, 0.5, 1.5]), torch.tensor([0.0, 1.0, 2.0])
        want = _both(q, k, v, do, tau_h.expand(b, h).contiguous(),
                     beta_h.expand(b, h).contiguous(), True)
        for p_score, p_den in ((tau_h.half(), beta_h[None, :, None, None].expand(b, h, 1, 1)),
                               (tau_h[None, :, None, None].half().expand(b, h, 1, 1),
                                beta_h.expand(b, h))):
            _same_bits(_both(q, k, v, do, p_score, p_den, True), want)
        want = _both(q, k, v, do, torch.full((b, h), 0.75), torch.full((b, h), 1.25), True)
        _same_bits(_both(q, k, v, do, 0.75, torch.tensor(1.25, dtype=torch.float16), True),
                   want)

    def test_fp16_gradients_at_a_small_tau_stay_finite_and_near_the_exact_ones() -> None:
        """tau = 1e-3 with near-tied scores (keys equal to within 1e-3) and large dO and v:
        tau ds reaches 9e4, so ds = y (dp - c)/tau rounded to fp16 for the dots overflowed
        (NaN dq and dk before); with 1/tau applied to the fp32 sums the gradients are finite
        and within 4x the first-order error bound of the 16-bit operands (ds rounded, c
        from fp16 out) and result of the fp64 gradients."""
        g = torch.Generator().manual_seed(5)
        b, h, n, d, scale = 1, 2, 24, 16, 0.3  # _both's scale
        q = torch.randn(b, h, n, d, generator=g) * 0.05
        k = torch.randn(b, h, 1, d, generator=g) + 1e-3 * torch.randn(b, h, n, d, generator=g)
        v, do = (torch.randn(b, h, n, d, generator=g) * 30 for _ in range(2))
        tau, beta = torch.full((b, h), 1e-3), torch.ones(b, h)
        q, k, v, do = (t.half() for t in (q, k, v, do))
        out, _, _, dq, dk, dv, dtau, dbeta = _both(q, k, v, do, tau, beta, False)
        for t in (out, dq, dk, dv, dtau, dbeta):
            assert t.isfinite().all()
        # the exact gradients of the fp16 inputs, in fp64
        q64, k64, v64, do64 = (t.double() for t in (q, k, v, do))
        s = scale * q64 @ k64.transpose(-1, -2)
        mx = s.clamp(min=0).amax(-1, keepdim=True)
        e = torch.where(s >= 0, torch.exp((s - mx) / 1e-3), 0.0)
        y = e / (e.sum(-1, keepdim=True) + torch.exp(-mx / 1e-3))
        o = y @ v64
        ds = y * (do64 @ v64.transpose(-1, -2) - (do64 * o).sum(-1, keepdim=True)) / 1e-3
        assert float(ds.abs().max()) > 65504  # ds in fp16 overflowed here
        # each ds: rounded once to 16 bits, and c = rowsum(dO o) read from out rounded to
        # fp16 (2^-11 of each |dO o| term), divided by tau with the weight
        dc = 2.0**-11 * (do64.abs() * out.double().abs()).sum(-1, keepdim=True)
        err = 2.0**-10 * ds.abs() + y * dc / 1e-3
        for got, want, bound in ((dq, scale * ds @ k64, scale * err @ k64.abs()),
                                 (dk, scale * ds.transpose(-1, -2) @ q64,
                                  scale * err.transpose(-1, -2) @ q64.abs())):
            bound = bound + 2.0**-11 * want.abs()  # the gradient rounded to fp16
            ratio = (got.double() - want).abs() / bound.clamp(min=1e-30)
            assert (ratio <= 4).all()  # a first-order bound, not a tight one
