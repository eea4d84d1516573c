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
        per_sm = max(1, 64 // num_warps)  # warp slots of an SM (64 on sm_80/sm_90)
        try:
            compiled = kernel.warmup(*args, grid=(1,), num_warps=num_warps, **consts)
            compiled._init_handles()
            regs = max(1, compiled.n_regs) * 32 * num_warps
            per_sm = min(per_sm, max(1, 65536 // regs))
            smem = compiled.metadata.shared
            if smem:
                per_sm = min(per_sm, max(1, props.shared_memory_per_multiprocessor // smem))
        except Exception:  # occupancy is a tuning hint; a failed query must not fail the call
            pass
        _OCCUPANCY[key] = props.multi_processor_count * per_sm
    return max(1, min(rows, _OCCUPANCY[key]))


def _launch(kernel, rows: int, args: tuple, block: int, **consts) -> None:
    num_warps = _num_warps(block)
    grid = (_programs(kernel, rows, args, num_warps, consts),)
    kernel[grid](*args, num_warps=num_warps, **consts)


def _check(x: torch.Tensor) -> tuple[int, int]:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise TypeError("triton kernels take a 2-D torch tensor (rows, n)")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"triton kernels support fp32, fp16 and bf16, not {x.dtype} "
                        "(verify with -d fp32,fp16,bf16)")
    return x.shape[0], x.shape[1]


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _plan(n: int) -> tuple[bool, int]:
    """(fused?, block): the fused path covers the row in one block, else stream chunks."""
    block = _pow2_at_least(n)
    if block <= ROW_PATHS.max_fused:
        return True, block
    return False, min(ROW_PATHS.chunk, block)



# ---------------------------------------------------------------------------------------
# Loads and stores in fp32. On a GPU bf16 converts natively (exact widening, round-to-nearest-
# even narrowing). The interpreter's own bf16 <-> fp32 conversion is not exact (no sticky
# bit, subnormals mangled), so under it bf16 tensors are passed as int16 and converted here
# with integer operations that do what the hardware does (BITS=True).


@triton.jit
def _ld(ptrs, mask, other, BITS: tl.constexpr):
    if BITS:
        u = tl.load(ptrs, mask=mask, other=0).to(tl.int32) & 0xFFFF
        v = tl.where(mask, (u << 16).to(tl.float32, bitcast=True), other)
    else:
        v = tl.load(ptrs, mask=mask, other=other).to(tl.float32)
    return v


@triton.jit
def _st(ptrs, v, mask, BITS: tl.constexpr):
    if BITS:
        u = v.to(tl.uint32, bitcast=True)
        rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
        quiet_nan = (u >> 16) | 0x40
        is_nan = (u & 0x7FFFFFFF) > 0x7F800000
        tl.store(ptrs, tl.where(is_nan, quiet_nan, rounded).to(tl.int16), mask=mask)
    else:
        tl.store(ptrs, v.to(ptrs.dtype.element_ty), mask=mask)


def _native(*tensors: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], bool]:
    """The tensors as the kernels see them, and BITS (bf16 as int16 under the interpreter)."""
    if _interpreted() and tensors[0].dtype == torch.bfloat16:
        return tuple(t.view(torch.int16) for t in tensors), True
    return tensors, False


# ---------------------------------------------------------------------------------------
# elastic, softmax, softmax1: y_i = exp((s_i - m)/tau) / (sum_j exp((s_j - m)/tau) + beta*exp(-m/tau))
# NONNEG: keep s >= 0 (elastic) rather than s > -inf; FLOOR0: m = max(m, 0) (softmax1);
# OFFSET: add the rescaled constant beta*exp(-m/tau) to the denominator.


@triton.jit
def _kept(x, NONNEG: tl.constexpr):
    # NONNEG: -0.0 >= 0 holds and NaN fails, as the mask requires
    return x >= 0.0 if NONNEG else x > float("-inf")


@triton.jit
def _exp_fused_kernel(x_ptr, y_ptr, rows, n, sx, sy, tau, beta,
                      NONNEG: tl.constexpr, FLOOR0: tl.constexpr, OFFSET: tl.constexpr,
                      BLOCK: tl.constexpr, BITS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        x = _ld(x_ptr + r * sx + offs, inside, float("-inf"), BITS)
        nan_row = tl.max((x != x).to(tl.int32), axis=0) > 0
        is_inf = x == float("inf")
        n_inf = tl.sum(is_inf.to(tl.float32), axis=0)
        # +inf is handled as the limit below; here only finite kept logits take part
        s = tl.where(_kept(x, NONNEG) & (x < float("inf")), x, float("-inf"))
        m = tl.max(s, axis=0)
        if FLOOR0:
            m = tl.maximum(m, 0.0)
        shift = tl.where(m > float("-inf"), m, 0.0)
        e = tl.exp(tl.math.div_rn(s - shift, tau))
        den = tl.sum(e, axis=0)
        if OFFSET:
            den += beta * tl.exp(tl.math.div_rn(-shift, tau))
        y = tl.math.div_rn(e, tl.where(den > 0.0, den, 1.0))  # 0/0 (nothing kept) -> 0
        y = tl.where(n_inf > 0.0, tl.math.div_rn(is_inf.to(tl.float32), n_inf), y)
        y = tl.where(nan_row, float("nan"), y)
        _st(y_ptr + r * sy + offs, y, inside, BITS)


@triton.jit
def _exp_online_kernel(x_ptr, y_ptr, rows, n, sx, sy, tau, beta,
                       NONNEG: tl.constexpr, FLOOR0: tl.constexpr, OFFSET: tl.constexpr,
                       BLOCK: tl.constexpr, BITS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        xrow = x_ptr + r * sx
        # pass 1: running max m of the finite kept logits and den = sum exp((s - m)/tau),
        # rescaled by exp((m_old - m_new)/tau) whenever the max grows
        m = float("-inf")
        den = 0.0
        nan_lanes = tl.zeros([BLOCK], dtype=tl.int32)
        inf_lanes = tl.zeros([BLOCK], dtype=tl.int32)
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            x = _ld(xrow + idx, idx < n, float("-inf"), BITS)
            nan_lanes = nan_lanes | (x != x).to(tl.int32)
            inf_lanes += (x == float("inf")).to(tl.int32)
            s = tl.where(_kept(x, NONNEG) & (x < float("inf")), x, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            shift = tl.where(m_new > float("-inf"), m_new, 0.0)
            den = den * tl.exp(tl.math.div_rn(m - shift, tau)) + tl.sum(
                tl.exp(tl.math.div_rn(s - shift, tau)), axis=0)
            m = m_new
        nan_row = tl.max(nan_lanes, axis=0) > 0
        n_inf = tl.sum(inf_lanes, axis=0).to(tl.float32)
        m_fin = m
        if FLOOR0:
            m_fin = tl.maximum(m, 0.0)
            den = den * tl.exp(tl.math.div_rn(m - m_fin, tau))
        shift = tl.where(m_fin > float("-inf"), m_fin, 0.0)
        if OFFSET:
            den += beta * tl.exp(tl.math.div_rn(-shift, tau))
        den = tl.where(den > 0.0, den, 1.0)
        # pass 2: normalize and write
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            inside = idx < n
            x = _ld(xrow + idx, inside, float("-inf"), BITS)
            s = tl.where(_kept(x, NONNEG) & (x < float("inf")), x, float("-inf"))
            y = tl.math.div_rn(tl.exp(tl.math.div_rn(s - shift, tau)), den)
            y = tl.where(n_inf > 0.0,
                         tl.math.div_rn((x == float("inf")).to(tl.float32), n_inf), y)
            y = tl.where(nan_row, float("nan"), y)
            _st(y_ptr + r * sy + idx, y, inside, BITS)


def _normalize_rows(x: torch.Tensor, fused_kernel: Any, online_kernel: Any,
                    scalars: tuple[float, ...], **constexprs: Any) -> torch.Tensor:
    """A new y = f(x) row by row: the register-resident kernel when a row fits, else the
    online one; scalars follow (x, y, rows, n, strides) in the kernel's arguments."""
    rows, n = _check(x)
    x = x.contiguous()
    y = torch.empty_like(x)
    if rows == 0 or n == 0:
        return y
    fused, block = _plan(n)
    (xk, yk), bits = _native(x, y)
    args = (xk, yk, rows, n, x.stride(0), y.stride(0), *scalars)
    _launch(fused_kernel if fused else online_kernel, rows, args, block, BLOCK=block, BITS=bits,
            **constexprs)
    return y


def _exp_normalize(x: torch.Tensor, *, tau: float, beta: float, nonneg: bool, floor0: bool,
                   offset: bool) -> torch.Tensor:
    return _normalize_rows(x, _exp_fused_kernel, _exp_online_kernel, (float(tau), float(beta)),
                           NONNEG=nonneg, FLOOR0=floor0, OFFSET=offset)


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
# divided by a power of two near the row's largest weight (when it exceeds 1), so neither
# the fp32 sum nor const/scale can overflow and the scaling itself is exact.


@triton.jit
def _weight(x, SYMAX: tl.constexpr):
    return tl.abs(x) if SYMAX else tl.where(x >= 0.0, x + 1.0, tl.math.div_rn(1.0, 1.0 - x))


@triton.jit
def _pow2_scale(top):
    """The power of two at or below top when top > 1 (exact: exponent bits only), else 1."""
    p2 = (top.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    return tl.where((top > 1.0) & (top < float("inf")), p2, 1.0)


@triton.jit
def _weight_fused_kernel(x_ptr, y_ptr, rows, n, sx, sy, const,
                         SYMAX: tl.constexpr, BLOCK: tl.constexpr, BITS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        x = _ld(x_ptr + r * sx + offs, inside, 0.0, BITS)
        nan_row = tl.max((x != x).to(tl.int32), axis=0) > 0
        w = tl.where(inside & (x == x), _weight(x, SYMAX), 0.0)
        is_inf = w == float("inf")
        n_inf = tl.sum(is_inf.to(tl.float32), axis=0)
        scale = _pow2_scale(tl.max(w, axis=0))
        ws = w / scale  # exact: scale is a power of two
        den = tl.sum(ws, axis=0) + const / scale
        y = tl.math.div_rn(ws, tl.where(den > 0.0, den, 1.0))
        y = tl.where(n_inf > 0.0, tl.math.div_rn(is_inf.to(tl.float32), n_inf), y)
        y = tl.where(nan_row, float("nan"), y)
        _st(y_ptr + r * sy + offs, y, inside, BITS)


@triton.jit
def _weight_online_kernel(x_ptr, y_ptr, rows, n, sx, sy, const,
                          SYMAX: tl.constexpr, BLOCK: tl.constexpr, BITS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        xrow = x_ptr + r * sx
        # pass 1: running power-of-two scale and scaled sum; rescaling by a ratio of powers
        # of two is exact
        scale = 1.0
        den = 0.0
        nan_lanes = tl.zeros([BLOCK], dtype=tl.int32)
        inf_lanes = tl.zeros([BLOCK], dtype=tl.int32)
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            inside = idx < n
            x = _ld(xrow + idx, inside, 0.0, BITS)
            nan_lanes = nan_lanes | (x != x).to(tl.int32)
            w = tl.where(inside & (x == x), _weight(x, SYMAX), 0.0)
            inf_lanes += (w == float("inf")).to(tl.int32)
            new_scale = tl.maximum(scale, _pow2_scale(tl.max(w, axis=0)))
            den = den * (scale / new_scale) + tl.sum(w / new_scale, axis=0)
            scale = new_scale
        nan_row = tl.max(nan_lanes, axis=0) > 0
        n_inf = tl.sum(inf_lanes, axis=0).to(tl.float32)
        den += const / scale
        den = tl.where(den > 0.0, den, 1.0)
        # pass 2
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            inside = idx < n
            x = _ld(xrow + idx, inside, 0.0, BITS)
            w = tl.where(x == x, _weight(x, SYMAX), 0.0)
            y = tl.math.div_rn(w / scale, den)
            y = tl.where(n_inf > 0.0,
                         tl.math.div_rn((w == float("inf")).to(tl.float32), n_inf), y)
            y = tl.where(nan_row, float("nan"), y)
            _st(y_ptr + r * sy + idx, y, inside, BITS)


def _weight_normalize(x: torch.Tensor, *, const: float, symax: bool) -> torch.Tensor:
    return _normalize_rows(x, _weight_fused_kernel, _weight_online_kernel, (float(const),),
                           SYMAX=symax)


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
# Elastic backward (DESIGN.md section 3). Per row, with z' = (s - m)/tau (shifted),
# e = exp(z'), D' = sum e + beta' and beta' = beta*exp(-m/tau) (so D = exp(m/tau) D'):
#   c     = sum g y
#   dx    = y (g - c) / tau                     (0 where s < 0)
#   dtau  = (sum y z - z_i weighted by g y)/tau = (c A - B + (m/tau) c (S - 1)) / tau
#           with A = sum y z', B = sum g y z', S = sum y = 1 - beta'/D'; the shift m/tau is
#           taken out analytically so no large z is ever formed and subtracted
#   dbeta = -c / D = -c exp(-m/tau) / D'
# Rows with nothing kept give 0 for both; rows with +inf give 0 (the limit); NaN propagates.
# Per-row partials go to a buffer that one program then sums in a fixed order.


@triton.jit
def _bwd_row_partials(c, a, b, den_s, beta_s, shift, tau, nothing, inf_row, nan_row):
    dtau = tl.math.div_rn(
        c * a - b - tl.math.div_rn(shift, tau) * c * tl.math.div_rn(beta_s, den_s), tau)
    dbeta = -tl.math.div_rn(c * tl.exp(tl.math.div_rn(-shift, tau)), den_s)
    dtau = tl.where(nothing | inf_row, 0.0, dtau)
    dbeta = tl.where(nothing | inf_row, 0.0, dbeta)
    dtau = tl.where(nan_row, float("nan"), dtau)
    dbeta = tl.where(nan_row, float("nan"), dbeta)
    return dtau, dbeta


@triton.jit
def _elastic_bwd_fused_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, rows, n, sx, sy, sg, sdx,
                              tau, beta, BLOCK: tl.constexpr, BITS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        x = _ld(x_ptr + r * sx + offs, inside, float("-inf"), BITS)
        y = _ld(y_ptr + r * sy + offs, inside, 0.0, BITS)
        g = _ld(g_ptr + r * sg + offs, inside, 0.0, BITS)
        masked = x < 0.0  # NaN is not masked: it must reach dx
        nan_row = tl.max((x != x).to(tl.int32), axis=0) > 0
        inf_row = tl.max((x == float("inf")).to(tl.int32), axis=0) > 0
        s = tl.where((x >= 0.0) & (x < float("inf")), x, float("-inf"))
        m = tl.max(s, axis=0)
        nothing = m == float("-inf")
        shift = tl.where(nothing, 0.0, m)
        zs = tl.math.div_rn(s - shift, tau)
        beta_s = beta * tl.exp(tl.math.div_rn(-shift, tau))
        den_s = tl.sum(tl.exp(zs), axis=0) + beta_s
        den_s = tl.where(den_s > 0.0, den_s, 1.0)
        gy = tl.where(masked, 0.0, g * y)
        c = tl.sum(gy, axis=0)
        dx = tl.where(masked, 0.0, tl.math.div_rn(y * (g - c), tau))
        _st(dx_ptr + r * sdx + offs, dx, inside, BITS)
        kept_z = s > float("-inf")
        a = tl.sum(tl.where(kept_z, y * zs, 0.0), axis=0)
        b = tl.sum(tl.where(kept_z, gy * zs, 0.0), axis=0)
        dtau, dbeta = _bwd_row_partials(c, a, b, den_s, beta_s, shift, tau, nothing, inf_row,
                                        nan_row)
        tl.store(part_ptr + row, dtau)
        tl.store(part_ptr + rows + row, dbeta)


@triton.jit
def _elastic_bwd_online_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, rows, n, sx, sy, sg, sdx,
                               tau, beta, BLOCK: tl.constexpr, BITS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        r = tl.cast(row, tl.int64)
        # pass 1: m and D' online (as the forward), c = sum g y, NaN and +inf flags
        m = float("-inf")
        den = 0.0
        c_lanes = tl.zeros([BLOCK], dtype=tl.float32)
        nan_lanes = tl.zeros([BLOCK], dtype=tl.int32)
        inf_lanes = tl.zeros([BLOCK], dtype=tl.int32)
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            inside = idx < n
            x = _ld(x_ptr + r * sx + idx, inside, float("-inf"), BITS)
            y = _ld(y_ptr + r * sy + idx, inside, 0.0, BITS)
            g = _ld(g_ptr + r * sg + idx, inside, 0.0, BITS)
            nan_lanes = nan_lanes | (x != x).to(tl.int32)
            inf_lanes = inf_lanes | (x == float("inf")).to(tl.int32)
            s = tl.where((x >= 0.0) & (x < float("inf")), x, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            sh = tl.where(m_new > float("-inf"), m_new, 0.0)
            den = den * tl.exp(tl.math.div_rn(m - sh, tau)) + tl.sum(
                tl.exp(tl.math.div_rn(s - sh, tau)), axis=0)
            m = m_new
            c_lanes += tl.where(x < 0.0, 0.0, g * y)
        nan_row = tl.max(nan_lanes, axis=0) > 0
        inf_row = tl.max(inf_lanes, axis=0) > 0
        c = tl.sum(c_lanes, axis=0)
        nothing = m == float("-inf")
        shift = tl.where(nothing, 0.0, m)
        beta_s = beta * tl.exp(tl.math.div_rn(-shift, tau))
        den_s = den + beta_s
        den_s = tl.where(den_s > 0.0, den_s, 1.0)
        # pass 2: dx, and A, B with the final shift
        a_lanes = tl.zeros([BLOCK], dtype=tl.float32)
        b_lanes = tl.zeros([BLOCK], dtype=tl.float32)
        for start in tl.range(0, n, BLOCK):
            idx = start + offs
            inside = idx < n
            x = _ld(x_ptr + r * sx + idx, inside, float("-inf"), BITS)
            y = _ld(y_ptr + r * sy + idx, inside, 0.0, BITS)
            g = _ld(g_ptr + r * sg + idx, inside, 0.0, BITS)
            masked = x < 0.0
            dx = tl.where(masked, 0.0, tl.math.div_rn(y * (g - c), tau))
            _st(dx_ptr + r * sdx + idx, dx, inside, BITS)
            s = tl.where((x >= 0.0) & (x < float("inf")), x, float("-inf"))
            kept_z = s > float("-inf")
            zs = tl.math.div_rn(s - shift, tau)
            a_lanes += tl.where(kept_z, y * zs, 0.0)
            b_lanes += tl.where(kept_z, g * y * zs, 0.0)
        a = tl.sum(a_lanes, axis=0)
        b = tl.sum(b_lanes, axis=0)
        dtau, dbeta = _bwd_row_partials(c, a, b, den_s, beta_s, shift, tau, nothing, inf_row,
                                        nan_row)
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
        fused, block = _plan(n)
        kernel = _elastic_bwd_fused_kernel if fused else _elastic_bwd_online_kernel
        (xk, yk, gk, dxk), bits = _native(x2d, y, g, dx)
        args = (xk, yk, gk, dxk, part, rows, n, x2d.stride(0), y.stride(0), g.stride(0),
                dx.stride(0), float(tau), float(beta))
        _launch(kernel, rows, args, block, BLOCK=block, BITS=bits)
        rblock = min(_pow2_at_least(rows), 1024)
        _sum_rows_kernel[(2,)](part, out, rows, BLOCK=rblock, num_warps=4)
    return dx, out[0], out[1]


@register_kernel(function="elastic", backend="triton", dtypes=DTYPES, name="triton_elastic",
                 mode="bwd")
def triton_elastic_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, *, tau: float,
                       beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Elastic-Softmax backward in Triton: dx, and dtau, dbeta summed over the whole tensor."""
    return elastic_backward(y, g, x, tau, beta)

