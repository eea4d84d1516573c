"""Exact bf16 for any Triton kernel under Triton's CPU interpreter (elasticbench.triton_interpreter).

The rounding helpers are checked here against exact rational arithmetic. The kernels run under
TRITON_INTERPRET=1, which must be on before `triton.jit` decorates them: as in test_triton.py,
an ordinary run re-runs this module in a subprocess with the interpreter on.
"""

from __future__ import annotations

import inspect
import math
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from elasticbench import devices
from elasticbench.triton_interpreter import bf16_bits, bf16_values

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "triton_bf16.py"


def nearest_bf16(x: float, toward_zero: bool = False) -> float:
    """x rounded to bf16 in exact rational arithmetic (8-bit significand, emin -126)."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    q = abs(Fraction(x))
    e = math.floor(math.log2(q))
    e += (Fraction(2) ** (e + 1) <= q) - (Fraction(2) ** e > q)  # log2 may be off by one
    e = max(e, -126)  # subnormals: the spacing stays 2^-133
    step = Fraction(2) ** (e - 7)
    n, rest = divmod(q, step)
    if not toward_zero and (rest > step / 2 or (rest == step / 2 and n % 2)):
        n += 1
    value = float(n * step)
    if value >= 2.0 ** 128 * (1 - 2.0 ** -9) and not toward_zero:  # past the largest + half
        value = math.inf
    return math.copysign(min(value, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))
                         if toward_zero else value, x)


def test_fp32_to_bf16_is_round_to_nearest_even() -> None:
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2**16, size=1000).astype(np.uint32) << 16) | 0x8000  # exact ties
    x = np.concatenate([bits, ties]).view(np.float32)
    with np.errstate(invalid="ignore"):  # the NaN inputs: compared apart below
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    got = bf16_bits(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(bf16_values(got[nan])).all()


def test_fp64_to_bf16_rounds_once() -> None:
    # just above the midpoint of 1 and 1 + 2^-7 by less than an fp32 ulp: rounding through
    # fp32 lands on the midpoint and then on 1.0; once, it is 1 + 2^-7
    trap = 1 + 2.0**-8 + 2.0**-30
    assert bf16_values(bf16_bits(np.array([trap])))[0] == 1 + 2.0**-7
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(3000) * 10.0 ** rng.integers(-45, 39, 3000),
                        [3.3961e38, 3.40e38, 1e-41, -9.2e-41, 2.0**-134, 1.5 * 2.0**-133]])
    got = bf16_values(bf16_bits(x))
    want = np.array([nearest_bf16(v) for v in x], dtype=np.float32)
    assert np.array_equal(got, want)
    rtz = bf16_values(bf16_bits(x, toward_zero=True))
    assert np.array_equal(rtz, [nearest_bf16(v, toward_zero=True) for v in x])


if not devices.triton_interpreted():

    @pytest.mark.needs("triton")
    def test_kernels_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__, "-k", "interpreted")

else:
    from types import SimpleNamespace

    import torch
    import triton
    import triton.language as tl

    from elasticbench.harness.registry import load_kernel_file
    from elasticbench.triton_interpreter import (
        CooperativeDeadlock,
        cooperative_grid,
        cooperative_supported,
        exact_bf16,
    )

    # loaded as `verify --kernel-file` loads it, so that the CLI below finds the same kernels
    fixture = SimpleNamespace(**load_kernel_file(FIXTURE)[0].fn.__globals__)

    def _bits(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous().view(torch.int16)

    def _pair(seed: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(n, generator=g) * 3).bfloat16(), torch.randn(n, generator=g).bfloat16()

    def test_interpreted_plain_interpreter_gets_bf16_addition_wrong() -> None:
        # why the patch exists; if a Triton upgrade fixes its interpreter, look again
        a, b = _pair(0)
        assert (_bits(fixture.add(a, b)) != _bits(a + b)).sum() >= 8

    def test_interpreted_bf16_addition_is_exact() -> None:
        a, b = _pair(0)
        with exact_bf16():
            got = fixture.add(a, b)
        assert torch.equal(_bits(got), _bits(a + b))  # torch's CPU bf16 add rounds once

    @triton.jit
    def _ops_kernel(a_ptr, b_ptr, f_ptr, out_ptr, bits_ptr, n: tl.constexpr):
        offs = tl.arange(0, n)
        a = tl.load(a_ptr + offs)
        b = tl.load(b_ptr + offs)
        f = tl.load(f_ptr + offs)
        tl.store(out_ptr + 0 * n + offs, a * b)
        tl.store(out_ptr + 1 * n + offs, a - b)
        tl.store(out_ptr + 2 * n + offs, tl.maximum(a, b))
        tl.store(out_ptr + 3 * n + offs, tl.abs(a))
        tl.store(out_ptr + 4 * n + offs, f.to(tl.bfloat16))
        tl.store(out_ptr + 5 * n + offs, tl.where(a < b, a, b))
        tl.store(out_ptr + 6 * n + offs, tl.fma(a, b, a))
        tl.store(out_ptr + 7 * n + offs, a.to(tl.int16, bitcast=True).to(tl.bfloat16,
                                                                        bitcast=True))
        tl.store(bits_ptr + offs, a.to(tl.int16, bitcast=True))
        tl.store(out_ptr + 8 * n, tl.max(a, axis=0))
        tl.store(out_ptr + 8 * n + 1, tl.min(a, axis=0))

    def test_interpreted_bf16_operations_round_like_a_gpu() -> None:
        n = 16
        a, b = _pair(1, n)
        a[:3] = torch.tensor([-0.0, float("inf"), float("nan")])
        f = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 3.0e38, -3.5e38, 2.0**-130, 1.1e-38,
                          float("nan"), -0.0] + [0.1 * i for i in range(8)])
        out = torch.empty(8 * n + 2, dtype=torch.bfloat16)
        bits = torch.empty(n, dtype=torch.int16)
        with exact_bf16():
            _ops_kernel[(1,)](a, b, f, out, bits, n=n)
        prod = (a.double() * b.double() + a.double()).numpy()
        want = [a * b, a - b, torch.fmax(a, b), a.abs(), f.bfloat16(),  # max.f32 drops NaN
                torch.where(a < b, a, b),
                torch.tensor([nearest_bf16(v) for v in prod]).bfloat16(), a]
        for k, w in enumerate(want):
            got = out[k * n:(k + 1) * n]
            same = (_bits(got) == _bits(w)) | (got.isnan() & w.isnan())
            assert same.all(), f"output {k}: {got} != {w}"
        assert torch.equal(bits, _bits(a))
        # tl.max and tl.min of a row with a NaN: 3.9's interpreter ignores it, 3.4's propagates
        # it as a GPU does; either way the bf16 values are compared as numbers
        finite = a[3:]
        top, bottom = out[8 * n].item(), out[8 * n + 1].item()
        assert top == max(float("inf"), finite.max().item()) or math.isnan(top)
        assert bottom == a[a == a].min().item() or (math.isnan(bottom) and math.isnan(top))

    @triton.jit
    def _accumulate_kernel(s_ptr, out_ptr, acc_ptr, n: tl.constexpr):
        offs = tl.arange(0, n)
        s = tl.load(s_ptr + offs)
        tl.store(out_ptr + offs, tl.cumsum(s, axis=0))
        tl.store(out_ptr + n, tl.sum(s, axis=0))
        tl.atomic_add(acc_ptr + offs * 0, s)

    def test_interpreted_bf16_sums_round_every_addition() -> None:
        # 1 + 2^-8 is a tie that rounds to 1 in bf16: summed in fp32 and rounded once, this row
        # would give 1 + 2^-7; rounded at every addition, as on a GPU, it stays 1
        s = torch.tensor([1.0, 2**-8, 2**-8, 0.0], dtype=torch.bfloat16)
        out = torch.empty(5, dtype=torch.bfloat16)
        acc = torch.zeros(1, dtype=torch.bfloat16)
        with exact_bf16():
            _accumulate_kernel[(1,)](s, out, acc, n=4)
        # tl.cumsum of Triton 3.6 and before promotes bf16 to fp32 (on a GPU too): its scan is
        # then 1, 1 + 2^-8, 1 + 2^-7, 1 + 2^-7 rounded once each
        body = inspect.getsource(tl.standard).split("def cumsum(", 1)[1].split("\ndef ", 1)[0]
        promotes = "_promote_bfloat16_to_float32" in body
        scan = [1.0, 1.0, 1.0078125, 1.0078125] if promotes else [1.0, 1.0, 1.0, 1.0]
        assert out.tolist() == [*scan, 1.0]
        assert acc.item() == 1.0  # atomics: load, add, round, store, lane by lane

    @triton.jit
    def _descriptor_kernel(src, dst, last, n: tl.constexpr):
        x = src.load([0, 0])
        dst.store([0, 0], (x * x + x).to(dst.dtype))
        last.store([n, 0], tl.sum(x, axis=0)[None, :].to(last.dtype))

    def test_interpreted_bf16_tensor_descriptors_load_and_store_values() -> None:
        # TMA's loads reach the interpreter's masked load with keyword hints: the patch must
        # take them and keep the values; a sum of bf16 loaded that way rounds every addition
        descriptors = pytest.importorskip("triton.tools.tensor_descriptor")
        n = 16
        a = (torch.randn(n, n, generator=torch.Generator().manual_seed(3)) * 3).bfloat16()
        out = torch.full((n + 1, n), 7.0, dtype=torch.bfloat16)
        src = descriptors.TensorDescriptor.from_tensor(a, [n, n])
        dst = descriptors.TensorDescriptor.from_tensor(out, [n, n])
        last = descriptors.TensorDescriptor.from_tensor(out, [1, n])
        with exact_bf16():
            _descriptor_kernel[(1,)](src, dst, last, n=n)
        assert torch.equal(_bits(out[:n]), _bits(a * a + a))  # two bf16 roundings, as torch
        col = a.float().sum(0)
        assert (out[n].float() - col).abs().max() <= 2.0 ** -6 * a.float().abs().sum(0).max()

    def test_interpreted_third_party_kernels_verify_in_bf16(cli) -> None:
        # Liger-style: the backward multiplies and sums in bf16; without exact bf16 every
        # bf16 case was garbage, while fp32 and fp16 passed
        run = cli("verify", "--kernel-file", str(FIXTURE), "--mode", "both", "--quick",
                  "-d", "fp32,fp16,bf16", "--input", "normal,uniform,ties_max,dominant")
        assert run.code == 0, run.out[-3000:] + run.err[-2000:]
        assert " 0 failed" in run.out

    # ---- cooperative launches: every program at once ---------------------------------------

    @triton.jit
    def _barrier_kernel(seen_ptr, cnt_ptr, bf16_ptr, WAIT_FOR: tl.constexpr):
        """Each program counts itself in, spins until WAIT_FOR have, and records what it saw
        and its program id; program 0 then adds 1 to a bf16 (exact_bf16's atomics inside)."""
        pid = tl.program_id(0)
        tl.atomic_add(cnt_ptr, 1, sem="release")
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
        while seen < WAIT_FOR:
            seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
        tl.store(seen_ptr + 2 * pid, seen)
        tl.store(seen_ptr + 2 * pid + 1, pid)
        if pid == 0:
            tl.atomic_add(bf16_ptr, 1.0)

    needs_cooperative = pytest.mark.skipif(
        not cooperative_supported(), reason="this Triton's interpreter lacks what "
        "cooperative_grid patches (the resident row path is then never planned under it)")

    @needs_cooperative
    def test_interpreted_cooperative_grid_runs_every_program_at_once() -> None:
        # program 0 can only pass its barrier once the 5 others have arrived: one after
        # another (the interpreter's own loop) it would spin for ever
        seen = torch.zeros(6, 2, dtype=torch.int32)
        cnt = torch.zeros(1, dtype=torch.int32)
        one = torch.full((1,), 3.0, dtype=torch.bfloat16)
        with exact_bf16(), cooperative_grid(timeout_s=20):
            _barrier_kernel[(6,)](seen, cnt, one, WAIT_FOR=6, launch_cooperative_grid=True)
        assert (seen[:, 0] >= 6).all() and seen[:, 1].tolist() == list(range(6))
        assert cnt.item() == 6 and one.item() == 4.0

    @needs_cooperative
    def test_interpreted_cooperative_deadlock_fails_in_time() -> None:
        # a barrier waiting for one program more than the grid has: on a GPU a hang; here
        # an error once no program has changed memory for the watchdog's time, every program
        # stopped, and the interpreter's patches undone
        import threading
        import time

        threads = threading.active_count()
        seen = torch.zeros(3, 2, dtype=torch.int32)
        cnt = torch.zeros(1, dtype=torch.int32)
        spare = torch.zeros(1, dtype=torch.float32)
        start = time.monotonic()
        with pytest.raises(Exception, match=r"CooperativeDeadlock.*none changed memory"), \
                cooperative_grid(timeout_s=0.5):
            _barrier_kernel[(3,)](seen, cnt, spare, WAIT_FOR=4, launch_cooperative_grid=True)
        assert time.monotonic() - start < 15
        assert threading.active_count() == threads
        assert issubclass(CooperativeDeadlock, RuntimeError)
        # outside the block a cooperative launch is the interpreter's own loop again: one
        # program at a time (a grid of one passes its barrier of one)
        cnt.zero_()
        _barrier_kernel[(1,)](seen, cnt, spare, WAIT_FOR=1, launch_cooperative_grid=True)
        assert seen[0].tolist() == [1, 0]
