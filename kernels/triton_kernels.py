"""Triton kernels for the family: elastic forward and backward, softmax, softmax1, stablemax, symax.

Every kernel reads fp32/fp16/bf16 rows, computes and accumulates in fp32, rounds once on
the store and follows the special-value policy of DESIGN.md section 2. Two paths by row
length (docs/triton.md):

- fused: the whole row lives in registers, one read and one write per element;
- online: rows longer than `ROW_PATHS.max_fused` are streamed in chunks, pass 1 keeping a
  running max and a rescaled running sum, pass 2 normalizing and writing.

Both run on a persistent grid (each program walks rows pid, pid + grid, ...). Divisions that
set the result use `tl.math.div_rn` (IEEE round-to-nearest); a plain `/` is approximate on
NVIDIA GPUs. `tl.exp` stays approximate on a GPU: its error is only measurable there.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from elasticbench import register_kernel

DTYPES = ("fp32", "fp16", "bf16")  # fp64 is not a GPU softmax format; the suite skips it

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class RowPaths:
    """Where the fused path ends and how long the online path's chunks are (powers of 2)."""

    max_fused: int = 16384
    chunk: int = 4096


def _env_pow2(name: str, default: int) -> int:
    value = int(os.environ.get(name, default))
    if value < 1 or value & (value - 1):
        raise ValueError(f"${name} must be a power of two, got {value}")
    return value


# $ELASTICBENCH_TRITON_MAX_FUSED / $ELASTICBENCH_TRITON_CHUNK move the thresholds, so that the
# CLI can verify the online path on short rows (docs/triton.md).
ROW_PATHS = RowPaths(_env_pow2("ELASTICBENCH_TRITON_MAX_FUSED", RowPaths.max_fused),
                     _env_pow2("ELASTICBENCH_TRITON_CHUNK", RowPaths.chunk))


@contextmanager
def row_paths(max_fused: int, chunk: int) -> Iterator[RowPaths]:
    """Temporarily change the path thresholds (tests force the online path with small ones)."""
    old = RowPaths(ROW_PATHS.max_fused, ROW_PATHS.chunk)
    ROW_PATHS.max_fused, ROW_PATHS.chunk = max_fused, chunk
    try:
        yield ROW_PATHS
    finally:
        ROW_PATHS.max_fused, ROW_PATHS.chunk = old.max_fused, old.chunk


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------------------
# Launch geometry


def _num_warps(block: int) -> int:
    if block <= 1024:
        return 4
    if block <= 4096:
        return 8
    return 16


@dataclass(frozen=True)
class SMLimits:
    """What one streaming multiprocessor holds (defaults: sm_80 and sm_90)."""

    regs: int = 65536
    warps: int = 64
    shared: int = 233472  # bytes; 228 KiB on sm_90, 164 KiB on sm_80
    programs: int = 32
    shared_reserved: int = 1024  # the runtime's own shared memory per program (sm_80+)


def resident_programs(n_regs: int, shared: int, num_warps: int, sm: SMLimits) -> int:
    """Programs of a compiled kernel that fit on one SM at once (at least 1).

    Registers are granted per warp in blocks of 256 (8 per thread), so n_regs rounds up to 8.
    """
    regs_per_program = -(-max(1, n_regs) // 8) * 8 * 32 * num_warps
    fits = [sm.regs // regs_per_program, sm.warps // num_warps, sm.programs]
    if shared:
        fits.append(sm.shared // (shared + sm.shared_reserved))
    return max(1, min(fits))


_OCCUPANCY: dict[tuple, int] = {}


def _programs(kernel, rows: int, args: tuple, num_warps: int, consts: dict) -> int:
    """Persistent grid size: rows capped by SMs x resident programs per SM.

    Resident programs per SM come from the compiled kernel's registers and shared memory;
    under the interpreter a handful of programs is enough to exercise the row loop.
    """
    if _interpreted() or not args[0].is_cuda:
        return max(1, min(rows, 4))
    dev = args[0].device
    key = (kernel, dev.index, num_warps, args[0].dtype, tuple(sorted(consts.items())))
    if key not in _OCCUPANCY:
        props = torch.cuda.get_device_properties(dev)
        sm = SMLimits(regs=getattr(props, "regs_per_multiprocessor", SMLimits.regs),
                      warps=getattr(props, "max_threads_per_multi_processor", 2048) // 32,
                      shared=getattr(props, "shared_memory_per_multiprocessor", SMLimits.shared))
        try:
            compiled = kernel.warmup(*args, grid=(1,), num_warps=num_warps,
                                     enable_fp_fusion=True, **consts)
            compiled._init_handles()
            per_sm = resident_programs(compiled.n_regs, compiled.metadata.shared, num_warps, sm)
        except Exception:  # occupancy is a tuning hint; a failed query must not fail the call
            per_sm = max(1, sm.warps // num_warps)
        _OCCUPANCY[key] = props.multi_processor_count * per_sm
    return max(1, min(rows, _OCCUPANCY[key]))


@dataclass
class Launch:
    """One kernel launch as the wrappers plan it: what `capture_launches` records."""

    kernel: Any
    args: tuple
    num_warps: int
    constexprs: dict[str, Any]


_CAPTURED: list[list[Launch]] = []


@contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Record the launches the wrappers would make instead of running them (outputs stay
    uninitialized); `triton_audit` compiles what is recorded for a GPU it does not have."""
    launches: list[Launch] = []
    _CAPTURED.append(launches)
    try:
        yield launches
    finally:
        _CAPTURED.pop()


def _run(kernel, grid: tuple[int], args: tuple, num_warps: int, consts: dict) -> None:
    if _CAPTURED:
        _CAPTURED[-1].append(Launch(kernel, args, num_warps, consts))
        return
    kernel[grid](*args, num_warps=num_warps, enable_fp_fusion=True, **consts)


def _launch(kernel, rows: int, args: tuple, block: int, **consts) -> None:
    num_warps = _num_warps(block)
    grid = (1,) if _CAPTURED else (_programs(kernel, rows, args, num_warps, consts),)
    _run(kernel, grid, args, num_warps, consts)


def _check(x: torch.Tensor) -> tuple[int, int]:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise TypeError("triton kernels take a 2-D torch tensor (rows, n)")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"triton kernels support fp32, fp16 and bf16, not {x.dtype} "
                        "(verify with -d fp32,fp16,bf16)")
    return x.shape[0], x.shape[1]


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _plan(n: int, max_fused: int) -> tuple[bool, int]:
    """(fused?, block): the fused path covers the row in one block, else stream chunks."""
    block = _pow2_at_least(n)
    if block <= max_fused:
        return True, block
    return False, min(ROW_PATHS.chunk, block)


LOG2E = 1.4426950408889634
FP32_MAX = 3.4028234663852886e38
FP32_MIN_NORMAL = 2.0 ** -126


def exp2_scale(tau: float) -> tuple[float, float]:
    """(k, pre) with exp(d / tau) = exp2((d * pre) * k) for the kernels' fp32 arithmetic.

    k = log2(e)/tau is formed in fp64 and rounded once, so the kernels multiply instead of
    dividing per element. pre is 1 unless tau is so small or large that k would leave fp32's
    normal range; then pre is a power of two (exact to apply) and k is clamped into that
    range, which keeps the limits right: one-hot on the maximum, or uniform.
    """
    k = LOG2E / tau
    exponent = math.frexp(k)[1]
    if -100 < exponent < 100:
        return k, 1.0
    pre = 2.0 ** max(-127, min(127, exponent))
    return min(max(k / pre, FP32_MIN_NORMAL), FP32_MAX), pre


# ---------------------------------------------------------------------------------------
# Loads and stores in fp32. On a GPU bf16 converts natively (exact widening, round-to-nearest-
# even narrowing). The interpreter's own bf16 <-> fp32 conversion is not exact (no sticky
# bit, subnormals mangled), so under it bf16 tensors are passed as int16 and converted here
# with integer operations that do what the hardware does (BITS=True).


@triton.jit
def _ld(ptrs, mask, other, BITS: tl.constexpr, EVEN: tl.constexpr):
    """Load as fp32; lanes outside mask read as other. EVEN: the block tiles the row exactly,
    so no lane is outside and the load needs no mask (nor the selects a mask costs)."""
    if BITS:
        if EVEN:
            u = tl.load(ptrs).to(tl.int32) & 0xFFFF
        else:
            u = tl.load(ptrs, mask=mask, other=0).to(tl.int32) & 0xFFFF
        v = (u << 16).to(tl.float32, bitcast=True)
        if not EVEN:
            v = tl.where(mask, v, other)
    elif EVEN:
        v = tl.load(ptrs).to(tl.float32)
    else:
        v = tl.load(ptrs, mask=mask, other=other).to(tl.float32)
    return v


@triton.jit
def _st(ptrs, v, mask, BITS: tl.constexpr, EVEN: tl.constexpr):
    if BITS:
        u = v.to(tl.uint32, bitcast=True)
        rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
        quiet_nan = (u >> 16) | 0x40
        is_nan = (u & 0x7FFFFFFF) > 0x7F800000
        v = tl.where(is_nan, quiet_nan, rounded).to(tl.int16)
    else:
        v = v.to(ptrs.dtype.element_ty)
    if EVEN:
        tl.store(ptrs, v)
    else:
        tl.store(ptrs, v, mask=mask)


def _native(*tensors: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], bool]:
    """The tensors as the kernels see them, and BITS (bf16 as int16 under the interpreter)."""
    if _interpreted() and tensors[0].dtype == torch.bfloat16:
        return tuple(t.view(torch.int16) for t in tensors), True
    return tensors, False


# ---------------------------------------------------------------------------------------
# Pieces every row kernel shares. A row's special values are found from one NaN-propagating
# maximum: NaN anywhere makes it NaN, a +inf (with no NaN) makes it +inf. Ordinary rows take
# the fast branch; the rare special rows a branch of their own, so the common path carries no
# per-element special-value selects.


@triton.jit
def _max_nan_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


INTERPRETED = tl.constexpr(_interpreted())


@triton.jit
def _max_nan(v):
    """Maximum of a block; NaN if any element is NaN. The interpreter runs a reduce with a
    custom combine element by element in Python, so there the same value comes from a max
    and a NaN count (numpy-vectorized); the GPU gets one max.NaN per element."""
    if INTERPRETED:
        top = tl.where(tl.max((v != v).to(tl.int32), axis=0) > 0, float("nan"),
                       tl.max(v, axis=0))
    else:
        top = tl.reduce(v, 0, _max_nan_combine)
    return top


@triton.jit
def _ordinary(top):
    """The row holds neither NaN nor +inf (top: its NaN-propagating maximum)."""
    return (top == top) & (top < float("inf"))


@triton.jit
def _special_y(is_inf, n_inf, top):
    """y of a special row: all NaN if it holds a NaN, else 1/k on each of its k infinities."""
    y = tl.where(is_inf, tl.math.div_rn(1.0, n_inf), 0.0)
    return tl.where(top != top, float("nan"), y)


@triton.jit
def _reciprocal(den, EXACT: tl.constexpr):
    """1/den for the quotient: exact division is kept for fp32 outputs (see _quotient)."""
    r = den if EXACT else tl.math.div_rn(1.0, den)
    return r


@triton.jit
def _quotient(w, r, EXACT: tl.constexpr):
    """w / den, r from _reciprocal. fp32 outputs divide (0.5 ulp); 16-bit outputs multiply by
    the rounded reciprocal (1 ulp of fp32, far below the 16-bit rounding that follows) and save
    the ~10 instructions of an IEEE division per element."""
    q = tl.math.div_rn(w, r) if EXACT else w * r
    return q


@triton.jit
def _log2_arg(d, k, PRE: tl.constexpr):
    """d log2(e) / tau, as (d * PRE) * k with k and PRE from exp2_scale."""
    if PRE != 1.0:
        d = d * PRE
    return d * k


def _exp2_model_ulps() -> int:
    """$ELASTICBENCH_TRITON_EXP2_ULPS under the interpreter, else -1 (no model; docs/triton.md)."""
    raw = os.environ.get("ELASTICBENCH_TRITON_EXP2_ULPS", "")
    if not raw or not _interpreted():
        return -1
    if not raw.isdigit():
        raise ValueError(f"$ELASTICBENCH_TRITON_EXP2_ULPS must be an integer >= 0, got {raw!r}")
    return int(raw)


# Under the interpreter tl.exp2 is NumPy's (nearly correctly rounded, with subnormals); on an
# NVIDIA GPU it is ex2.approx.ftz. With EXP2_ULPS >= 0 the interpreter models the GPU's: results
# below 2^-126 flush to 0 and every other normal result moves EXP2_ULPS ulps up or down (by the
# argument's low bit), so the budgets can be checked against an approximate ex2 without a GPU.
EXP2_ULPS = tl.constexpr(_exp2_model_ulps())


@triton.jit
def _exp2(v, SUBNORMAL: tl.constexpr):
    """2^v. On NVIDIA GPUs tl.exp2 is ex2.approx.ftz: results below 2^-126 flush to 0. Outputs
    with subnormals (fp32, bf16) need them: SUBNORMAL forms those as 2^(v + 64) * 2^-64, where
    v + 64 is exact for v in [-152, -126) and the power-of-two product rounds once."""
    tiny = v < -126.0
    if SUBNORMAL:
        v = tl.where(tiny, v + 64.0, v)
    e = tl.exp2(v)
    if EXP2_ULPS >= 0:
        normal = (e >= 1.1754943508222875e-38) & (e < float("inf"))
        step = tl.where((v.to(tl.int32, bitcast=True) & 1) == 1, EXP2_ULPS, -EXP2_ULPS)
        moved = (e.to(tl.int32, bitcast=True) + step).to(tl.float32, bitcast=True)
        e = tl.where(normal & (v != 0.0), moved, tl.where(normal | (e == float("inf")), e, 0.0))
    if SUBNORMAL:
        e = tl.where(tiny, e * 5.421010862427522e-20, e)  # 2^-64
    return e


@triton.jit
def _exp2_scaled(d, k, PRE: tl.constexpr, SUBNORMAL: tl.constexpr):
    """exp(d / tau)."""
    return _exp2(_log2_arg(d, k, PRE), SUBNORMAL)


# ---------------------------------------------------------------------------------------
# elastic, softmax, softmax1: y_i = exp((s_i - m)/tau) / (sum_j exp((s_j - m)/tau) + beta*exp(-m/tau))
# NONNEG: negatives masked to -inf (elastic) rather than only -inf; FLOOR0: m = max(m, 0)
# (softmax1); OFFSET: add the rescaled constant beta*exp(-m/tau) to the denominator.


@triton.jit
def _keep(x, NONNEG: tl.constexpr):
    """NVM: x < 0 becomes -inf; NaN and -0.0 stay (NaN flags the row, -0.0 is kept)."""
    s = tl.where(x < 0.0, float("-inf"), x) if NONNEG else x
    return s


@triton.jit
def _exp_shift(top, FLOOR0: tl.constexpr):
    """The shift m of an ordinary row from its kept max (0 when nothing is kept)."""
    shift = tl.where(top > float("-inf"), top, 0.0)
    if FLOOR0:
        shift = tl.maximum(shift, 0.0)
    return shift


@triton.jit
def _exp_den(den, shift, k, beta, OFFSET: tl.constexpr, PRE: tl.constexpr):
    """The denominator sum exp((s - m)/tau) + beta exp(-m/tau), 1 when it is 0 (0/0 -> 0)."""
    if OFFSET:
        den += beta * _exp2_scaled(-shift, k, PRE, False)
    return tl.where(den > 0.0, den, 1.0)


@triton.jit
def _online_step(top, den, s, k, PRE: tl.constexpr):
    """One chunk of an online pass: the running NaN-propagating max and den = sum
    exp((s - max)/tau), rescaled by exp((old - new)/tau) when the max grows."""
    new = tl.maximum(top, _max_nan(s), propagate_nan=tl.PropagateNan.ALL)
    m = tl.where(new > float("-inf"), new, 0.0)
    e = _exp2_scaled(s - m, k, PRE, False)
    return new, den * _exp2_scaled(top - m, k, PRE, False) + tl.sum(e, axis=0)


@triton.jit
def _exp_fused_kernel(x_ptr, y_ptr, rows, n, sx, sy, k, beta,
                      NONNEG: tl.constexpr, FLOOR0: tl.constexpr, OFFSET: tl.constexpr,
                      PRE: tl.constexpr, EXACT: tl.constexpr, SUBNORMAL: tl.constexpr,
                      BLOCK: tl.constexpr, BITS: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        x = _ld(x_ptr + r * sx + offs, inside, float("-inf"), BITS, EVEN)
        s = _keep(x, NONNEG)
        top = _max_nan(s)
        if _ordinary(top):
            shift = _exp_shift(top, FLOOR0)
            e = _exp2_scaled(s - shift, k, PRE, SUBNORMAL)
            den = _exp_den(tl.sum(e, axis=0), shift, k, beta, OFFSET, PRE)
            y = _quotient(e, _reciprocal(den, EXACT), EXACT)
        else:
            is_inf = x == float("inf")
            y = _special_y(is_inf, tl.sum(is_inf.to(tl.float32), axis=0), top)
        _st(y_ptr + r * sy + offs, y, inside, BITS, EVEN)


@triton.jit
def _exp_online_kernel(x_ptr, y_ptr, rows, n, sx, sy, k, beta,
                       NONNEG: tl.constexpr, FLOOR0: tl.constexpr, OFFSET: tl.constexpr,
                       PRE: tl.constexpr, EXACT: tl.constexpr, SUBNORMAL: tl.constexpr,
                       BLOCK: tl.constexpr, BITS: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        xrow = x_ptr + r * sx
        yrow = y_ptr + r * sy
        # pass 1: running NaN-propagating max and den = sum exp((s - max)/tau), rescaled by
        # exp((old - new)/tau) whenever the max grows
        top = float("-inf")
        den = 0.0
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            s = _keep(_ld(xrow + idx, idx < n, float("-inf"), BITS, EVEN), NONNEG)
            top, den = _online_step(top, den, s, k, PRE)
        if _ordinary(top):
            shift = _exp_shift(top, FLOOR0)
            if FLOOR0:  # pass 1 shifted by the max alone
                den = den * _exp2_scaled(_exp_shift(top, False) - shift, k, PRE, False)
            rden = _reciprocal(_exp_den(den, shift, k, beta, OFFSET, PRE), EXACT)
            for start in tl.range(0, n, BLOCK):  # pass 2: normalize and write
                idx = start + offs
                inside = idx < n
                s = _keep(_ld(xrow + idx, inside, float("-inf"), BITS, EVEN), NONNEG)
                e = _exp2_scaled(s - shift, k, PRE, SUBNORMAL)
                _st(yrow + idx, _quotient(e, rden, EXACT), inside, BITS, EVEN)
        else:
            n_inf = 0.0
            for start in tl.range(0, n, BLOCK):
                idx = start + offs
                x = _ld(xrow + idx, idx < n, float("-inf"), BITS, EVEN)
                n_inf += tl.sum((x == float("inf")).to(tl.float32), axis=0)
            for start in tl.range(0, n, BLOCK):
                idx = start + offs
                inside = idx < n
                x = _ld(xrow + idx, inside, float("-inf"), BITS, EVEN)
                _st(yrow + idx, _special_y(x == float("inf"), n_inf, top), inside, BITS, EVEN)


def _normalize_rows(x: torch.Tensor, fused_kernel: Any, online_kernel: Any,
                    scalars: tuple[float, ...], **constexprs: Any) -> torch.Tensor:
    """A new y = f(x) row by row: the register-resident kernel when a row fits, else the
    online one; scalars follow (x, y, rows, n, strides) in the kernel's arguments."""
    rows, n = _check(x)
    x = x.contiguous()
    y = torch.empty_like(x)
    if rows == 0 or n == 0:
        return y
    fused, block = _plan(n, ROW_PATHS.max_fused)
    (xk, yk), bits = _native(x, y)
    args = (xk, yk, rows, n, x.stride(0), y.stride(0), *scalars)
    _launch(fused_kernel if fused else online_kernel, rows, args, block, BLOCK=block, BITS=bits,
            EVEN=n % block == 0, EXACT=x.dtype == torch.float32, **constexprs)
    return y


def _exp_normalize(x: torch.Tensor, *, tau: float, beta: float, nonneg: bool, floor0: bool,
                   offset: bool) -> torch.Tensor:
    k, pre = exp2_scale(tau)
    # fp16 has no outputs below 2^-126 (its subnormals end at 2^-24): a flushed exp2 is exact
    return _normalize_rows(x, _exp_fused_kernel, _exp_online_kernel, (k, float(beta)),
                           NONNEG=nonneg, FLOOR0=floor0, OFFSET=offset, PRE=pre,
                           SUBNORMAL=x.dtype != torch.float16)


def _check_tau_beta(tau: float, beta: float) -> None:
    if not (tau > 0 and tau < float("inf")):
        raise ValueError(f"tau must be finite and > 0, got {tau!r}")
    if not (beta >= 0 and beta < float("inf")):
        raise ValueError(f"beta must be finite and >= 0, got {beta!r}")


def elastic_forward(x2d: torch.Tensor, tau: float, beta: float) -> torch.Tensor:
    """Elastic-Softmax of a 2-D tensor along its rows: a new tensor of the same shape/dtype."""
    _check_tau_beta(tau, beta)
    return _exp_normalize(x2d, tau=tau, beta=beta, nonneg=True, floor0=False, offset=beta > 0)


@register_kernel(function="elastic", backend="triton", dtypes=DTYPES, name="triton_elastic")
def triton_elastic(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Elastic-Softmax in Triton: NVM mask, shift by the kept max, beta rescaled by exp(-m/tau)."""
    return elastic_forward(x, tau, beta)


@register_kernel(function="softmax", backend="triton", dtypes=DTYPES, name="triton_softmax")
def triton_softmax(x: torch.Tensor) -> torch.Tensor:
    """Safe softmax in Triton: shifted by the max; an all -inf row gives zeros."""
    return _exp_normalize(x, tau=1.0, beta=0.0, nonneg=False, floor0=False, offset=False)


@register_kernel(function="softmax1", backend="triton", dtypes=DTYPES, name="triton_softmax1")
def triton_softmax1(x: torch.Tensor) -> torch.Tensor:
    """Softmax1 in Triton: shift m = max(max x, 0), the 1 rescaled to exp(-m)."""
    return _exp_normalize(x, tau=1.0, beta=1.0, nonneg=False, floor0=True, offset=True)


# ---------------------------------------------------------------------------------------
# stablemax and symax: y_i = w_i / (const + sum_j w_j) for weights w >= 0. The weights are
# multiplied by the reciprocal of a power of two near the row's largest weight (when it
# exceeds 1), so neither the fp32 sum nor const can overflow and the scaling is exact.
# Lanes past the row load as -inf for stablemax and 0 for symax: both weigh 0.


@triton.jit
def _weight(x, SYMAX: tl.constexpr, EXACT: tl.constexpr):
    if SYMAX:
        w = tl.abs(x)
    elif EXACT:
        w = tl.where(x >= 0.0, x + 1.0, tl.math.div_rn(1.0, 1.0 - x))
    else:  # 16-bit outputs: an approximate reciprocal (2 ulp of fp32) is ample
        w = tl.where(x >= 0.0, x + 1.0, 1.0 / (1.0 - x))
    return w


@triton.jit
def _inv_pow2_scale(top):
    """1/p for the power of two p at or below top when 1 < top < inf (exponent bits only),
    else 1: an exact scale."""
    p2 = (top.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    return tl.math.div_rn(1.0, tl.where((top > 1.0) & (top < float("inf")), p2, 1.0))


@triton.jit
def _weight_fused_kernel(x_ptr, y_ptr, rows, n, sx, sy, const, OTHER: tl.constexpr,
                         SYMAX: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr,
                         BITS: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        w = _weight(_ld(x_ptr + r * sx + offs, inside, OTHER, BITS, EVEN), SYMAX, EXACT)
        top = _max_nan(w)
        if _ordinary(top):
            inv = _inv_pow2_scale(top)
            ws = w * inv
            den = tl.sum(ws, axis=0) + const * inv
            y = _quotient(ws, _reciprocal(tl.where(den > 0.0, den, 1.0), EXACT), EXACT)
        else:
            is_inf = w == float("inf")
            y = _special_y(is_inf, tl.sum(is_inf.to(tl.float32), axis=0), top)
        _st(y_ptr + r * sy + offs, y, inside, BITS, EVEN)


@triton.jit
def _weight_online_kernel(x_ptr, y_ptr, rows, n, sx, sy, const, OTHER: tl.constexpr,
                          SYMAX: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr,
                          BITS: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        xrow = x_ptr + r * sx
        yrow = y_ptr + r * sy
        # pass 1: running max and power-of-two scale; rescaling the sum by a ratio of powers
        # of two is exact
        top = 0.0
        inv = 1.0
        den = 0.0
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            w = _weight(_ld(xrow + idx, idx < n, OTHER, BITS, EVEN), SYMAX, EXACT)
            top = tl.maximum(top, _max_nan(w), propagate_nan=tl.PropagateNan.ALL)
            new_inv = tl.minimum(inv, _inv_pow2_scale(top))
            den = den * tl.math.div_rn(new_inv, inv) + tl.sum(w * new_inv, axis=0)
            inv = new_inv
        if _ordinary(top):
            den += const * inv
            rden = _reciprocal(tl.where(den > 0.0, den, 1.0), EXACT)
            for start in tl.range(0, n, BLOCK):  # pass 2
                idx = start + offs
                inside = idx < n
                w = _weight(_ld(xrow + idx, inside, OTHER, BITS, EVEN), SYMAX, EXACT)
                _st(yrow + idx, _quotient(w * inv, rden, EXACT), inside, BITS, EVEN)
        else:
            n_inf = 0.0
            for start in tl.range(0, n, BLOCK):
                idx = start + offs
                w = _weight(_ld(xrow + idx, idx < n, OTHER, BITS, EVEN), SYMAX, EXACT)
                n_inf += tl.sum((w == float("inf")).to(tl.float32), axis=0)
            for start in tl.range(0, n, BLOCK):
                idx = start + offs
                inside = idx < n
                w = _weight(_ld(xrow + idx, inside, OTHER, BITS, EVEN), SYMAX, EXACT)
                _st(yrow + idx, _special_y(w == float("inf"), n_inf, top), inside, BITS, EVEN)


def _weight_normalize(x: torch.Tensor, *, const: float, symax: bool) -> torch.Tensor:
    return _normalize_rows(x, _weight_fused_kernel, _weight_online_kernel, (float(const),),
                           OTHER=0.0 if symax else float("-inf"), SYMAX=symax)


@register_kernel(function="stablemax", backend="triton", dtypes=DTYPES, name="triton_stablemax")
def triton_stablemax(x: torch.Tensor) -> torch.Tensor:
    """Stablemax in Triton, weights scaled by a power of two near the row maximum."""
    return _weight_normalize(x, const=0.0, symax=False)


@register_kernel(function="symax", backend="triton", dtypes=DTYPES, name="triton_symax")
def triton_symax(x: torch.Tensor, *, eta: float) -> torch.Tensor:
    """Symax in Triton: |x| / (eta + sum |x|), scaled by a power of two near max |x|."""
    if not (eta >= 0 and eta < float("inf")):
        raise ValueError(f"eta must be finite and >= 0, got {eta!r}")
    return _weight_normalize(x, const=eta, symax=True)


# ---------------------------------------------------------------------------------------
# Elastic backward (DESIGN.md section 3). Per row, with t = (s - m) log2(e)/tau (shifted, in
# base-2 units), e = exp2(t), D' = sum e + beta' and beta' = beta*exp(-m/tau):
#   c     = sum g y
#   dx    = y (g - c) / tau                     (0 where x < 0)
#   dtau  = (c A - B + (m/tau) c (S - 1)) / tau with A = ln2 sum y t, B = ln2 sum g y t and
#           S - 1 = -beta'/D'; the shift m/tau is taken out analytically, so no large z is
#           ever formed and subtracted
#   dbeta = -c exp(-m/tau) / D'
# Rows with nothing kept give 0 for both; rows with +inf give 0 (the limit); NaN propagates.
# Per-row partials go to a buffer that one program then sums in a fixed order.

LN2 = tl.constexpr(0.6931471805599453)  # jit code reads only constexpr globals


@triton.jit
def _bwd_dx(x, y, g, c, tau, inv_tau, inf_row, EXACT: tl.constexpr):
    """dx = y (g - c) / tau; 0 where x < 0 and on rows with +inf (their output is constant);
    NaN is not masked: it must reach dx."""
    v = y * (g - c)
    v = tl.math.div_rn(v, tau) if EXACT else v * inv_tau
    return tl.where(inf_row, 0.0, tl.where(x < 0.0, 0.0, v))


@triton.jit
def _bwd_t(s, m, y, k, PRE: tl.constexpr):
    """t = (s - m) log2(e)/tau where y != 0, else 0: y t -> 0 there (masked, or exp underflowed
    while t may have overflowed to -inf) and 0 * -inf must not make A or B NaN."""
    return tl.where(y != 0.0, _log2_arg(s - m, k, PRE), 0.0)


@triton.jit
def _regular(top):
    """Something kept and no NaN or +inf (top: the row's NaN-propagating kept max)."""
    return _ordinary(top) & (top > float("-inf"))


@triton.jit
def _ld_xyg(x_ptr, y_ptr, g_ptr, r, sx, sy, sg, idx, inside, BITS: tl.constexpr,
            EVEN: tl.constexpr):
    """x, y, g of row r at idx; lanes past the row read x = -inf (masked), y = g = 0."""
    x = _ld(x_ptr + r * sx + idx, inside, float("-inf"), BITS, EVEN)
    y = _ld(y_ptr + r * sy + idx, inside, 0.0, BITS, EVEN)
    g = _ld(g_ptr + r * sg + idx, inside, 0.0, BITS, EVEN)
    return x, y, g


@triton.jit
def _bwd_row_partials(c, a2, b2, den, top, shift, k, tau, beta, PRE: tl.constexpr):
    """(dtau, dbeta) of one row from c, A/ln2, B/ln2, D', its NaN-propagating max and the
    shift its sums were taken with."""
    decay = _exp2_scaled(-shift, k, PRE, False)  # exp(-m/tau)
    beta_s = beta * decay
    den_s = den + beta_s
    den_s = tl.where(den_s > 0.0, den_s, 1.0)
    # beta' = 0 (beta = 0, or exp(-m/tau) underflowed while m/tau may be inf): no offset term
    offset = tl.where(beta_s > 0.0,
                      tl.math.div_rn(shift, tau) * c * tl.math.div_rn(beta_s, den_s), 0.0)
    dtau = tl.math.div_rn((c * a2 - b2) * LN2 - offset, tau)
    dbeta = -tl.math.div_rn(c * decay, den_s)
    regular = _regular(top)  # nothing kept or +inf: 0 (the limit)
    dtau = tl.where(top != top, float("nan"), tl.where(regular, dtau, 0.0))
    dbeta = tl.where(top != top, float("nan"), tl.where(regular, dbeta, 0.0))
    return dtau, dbeta


@triton.jit
def _elastic_bwd_fused_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, rows, n, sx, sy, sg, sdx,
                              k, tau, inv_tau, beta, PRE: tl.constexpr, EXACT: tl.constexpr,
                              BLOCK: tl.constexpr, BITS: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        x, y, g = _ld_xyg(x_ptr, y_ptr, g_ptr, r, sx, sy, sg, offs, inside, BITS, EVEN)
        s = _keep(x, True)
        top = _max_nan(s)
        m = tl.where(_regular(top), top, 0.0)
        # den >= 1: terms an ftz exp2 flushes are lost in its rounding anyway
        den = tl.sum(_exp2_scaled(s - m, k, PRE, False), axis=0)
        gy = tl.where(x < 0.0, 0.0, g * y)
        c = tl.sum(gy, axis=0)
        dx = _bwd_dx(x, y, g, c, tau, inv_tau, top == float("inf"), EXACT)
        _st(dx_ptr + r * sdx + offs, dx, inside, BITS, EVEN)
        t = _bwd_t(s, m, y, k, PRE)
        dtau, dbeta = _bwd_row_partials(c, tl.sum(y * t, axis=0), tl.sum(gy * t, axis=0), den,
                                        top, m, k, tau, beta, PRE)
        tl.store(part_ptr + row, dtau)
        tl.store(part_ptr + rows + row, dbeta)


@triton.jit
def _elastic_bwd_online_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, rows, n, sx, sy, sg, sdx,
                               k, tau, inv_tau, beta, PRE: tl.constexpr, EXACT: tl.constexpr,
                               BLOCK: tl.constexpr, BITS: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        # pass 1: max and D' online (as the forward) and c = sum g y
        top = float("-inf")
        den = 0.0
        c_lanes = tl.zeros([BLOCK], dtype=tl.float32)
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            inside = idx < n
            x, y, g = _ld_xyg(x_ptr, y_ptr, g_ptr, r, sx, sy, sg, idx, inside, BITS, EVEN)
            s = _keep(x, True)
            top, den = _online_step(top, den, s, k, PRE)
            c_lanes += tl.where(x < 0.0, 0.0, g * y)
        c = tl.sum(c_lanes, axis=0)
        m = tl.where(_regular(top), top, 0.0)
        # pass 2: dx, and A, B with the final shift
        a_lanes = tl.zeros([BLOCK], dtype=tl.float32)
        b_lanes = tl.zeros([BLOCK], dtype=tl.float32)
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            inside = idx < n
            x, y, g = _ld_xyg(x_ptr, y_ptr, g_ptr, r, sx, sy, sg, idx, inside, BITS, EVEN)
            dx = _bwd_dx(x, y, g, c, tau, inv_tau, top == float("inf"), EXACT)
            _st(dx_ptr + r * sdx + idx, dx, inside, BITS, EVEN)
            t = _bwd_t(_keep(x, True), m, y, k, PRE)
            a_lanes += y * t
            b_lanes += tl.where(x < 0.0, 0.0, g * y) * t
        dtau, dbeta = _bwd_row_partials(c, tl.sum(a_lanes, axis=0), tl.sum(b_lanes, axis=0), den,
                                        top, m, k, tau, beta, PRE)
        tl.store(part_ptr + row, dtau)
        tl.store(part_ptr + rows + row, dbeta)


@triton.jit
def _sum_rows_kernel(part_ptr, out_ptr, rows, BLOCK: tl.constexpr):
    """out[k] = sum of part[k*rows : (k+1)*rows], in one fixed order (one program per k)."""
    k = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for start in tl.range(0, rows, BLOCK):
        idx = start + offs
        acc += tl.load(part_ptr + k * rows + idx, mask=idx < rows, other=0.0).to(tl.float64)
    tl.store(out_ptr + k, tl.sum(acc, axis=0).to(tl.float32))


def elastic_backward(y: torch.Tensor, g: torch.Tensor, x2d: torch.Tensor, tau: float,
                     beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dtau, dbeta) of sum(g * elastic(x)); dtau, dbeta 0-d fp32 tensors, deterministic."""
    _check_tau_beta(tau, beta)
    rows, n = _check(x2d)
    if y.shape != x2d.shape or g.shape != x2d.shape:
        raise ValueError(f"x, y and g must have one shape, got {tuple(x2d.shape)}, "
                         f"{tuple(y.shape)}, {tuple(g.shape)}")
    if y.dtype != x2d.dtype or g.dtype != x2d.dtype:
        raise TypeError(f"x, y and g must have one dtype, got {x2d.dtype}, {y.dtype}, {g.dtype}")
    x2d, y, g = x2d.contiguous(), y.contiguous(), g.contiguous()
    dx = torch.empty_like(x2d)
    out = torch.zeros(2, dtype=torch.float32, device=x2d.device)
    if rows and n:
        part = torch.empty(2 * rows, dtype=torch.float32, device=x2d.device)
        # three arrays live in registers: half the forward's fused rows, or it spills
        fused, block = _plan(n, ROW_PATHS.max_fused // 2)
        kernel = _elastic_bwd_fused_kernel if fused else _elastic_bwd_online_kernel
        (xk, yk, gk, dxk), bits = _native(x2d, y, g, dx)
        k, pre = exp2_scale(tau)
        args = (xk, yk, gk, dxk, part, rows, n, x2d.stride(0), y.stride(0), g.stride(0),
                dx.stride(0), k, float(tau), 1.0 / tau, float(beta))
        _launch(kernel, rows, args, block, BLOCK=block, BITS=bits, EVEN=n % block == 0, PRE=pre,
                EXACT=x2d.dtype == torch.float32)
        rblock = min(_pow2_at_least(rows), 1024)
        _run(_sum_rows_kernel, (2,), (part, out, rows), 4, {"BLOCK": rblock})
    return dx, out[0], out[1]


@register_kernel(function="elastic", backend="triton", dtypes=DTYPES, name="triton_elastic",
                 mode="bwd")
def triton_elastic_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, *, tau: float,
                       beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Elastic-Softmax backward in Triton: dx, and dtau, dbeta summed over the whole tensor."""
    return elastic_backward(y, g, x2d=x, tau=tau, beta=beta)
