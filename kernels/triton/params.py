"""Where a row kernel finds its row's tau and beta: launch scalars, or device memory.

Scalars (`scalar_params`) are what the registered kernels pass: Python floats, with
k = log2(e)/tau formed on the host in fp64 and rounded once (exp_family.exp2_scale). From
memory (`memory_params`) is what elasticbench.functional passes: tau and beta as tensors on
the device, one value for every row or one per row, broadcast against the rows as an
elementwise operand would be; each program loads its row's pair and forms k the same way in
fp64 (`row_params`), so that nothing is read back to the host, no table is built, and the
launch is the same whatever values the parameters hold. The kernels locate row r's values
through up to three (size, stride) dimensions of the rows' leading shape (a stride of 0
where a parameter is broadcast); parameters whose layout needs more are copied into one
value per row first.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
FP32_MAX = 3.4028234663852886e38
FP32_MIN_NORMAL = 2.0 ** -126
FAR = 100  # |exponent of k| from which k is moved by a power of two (exp2_scale)
# what the jit code reads (a kernel may read only constexpr globals)
_LOG2E, _FAR = tl.constexpr(LOG2E), tl.constexpr(FAR)
_FP32_MAX, _FP32_MIN_NORMAL = tl.constexpr(FP32_MAX), tl.constexpr(FP32_MIN_NORMAL)


def exp2_scale(tau: float) -> tuple[float, float]:
    """(k, pre) with exp(d / tau) = exp2((d * pre) * k) for the kernels' fp32 arithmetic.

    k = log2(e)/tau is formed in fp64 and rounded once, so the kernels multiply instead of
    dividing per element. pre is 1 unless tau is so small or large that k would leave fp32's
    normal range; then pre is a power of two (exact to apply) and k is clamped into that
    range, which keeps the limits right: one-hot on the maximum, or uniform.
    """
    k = LOG2E / tau
    exponent = math.frexp(k)[1]
    if -FAR < exponent < FAR:
        return k, 1.0
    pre = 2.0 ** max(-127, min(127, exponent))
    return min(max(k / pre, FP32_MIN_NORMAL), FP32_MAX), pre


@triton.jit
def _exp2_scale(tau):
    """exp2_scale of a row's tau (any float type) on the device: (k, pre, tau, 1/tau) in
    fp32, k and 1/tau formed in fp64 and rounded once, pre from k's exponent bits."""
    t = tau.to(tl.float64)
    k = tl.full([], _LOG2E, tl.float64) / t
    exponent = ((k.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1022  # frexp's
    clamped = tl.minimum(tl.maximum(exponent, -127), 127)
    power = ((clamped + 1023) << 52).to(tl.float64, bitcast=True)
    far = (exponent <= -_FAR) | (exponent >= _FAR)
    pre = tl.where(far, power, 1.0)
    k = tl.where(far, tl.minimum(tl.maximum(k / pre, _FP32_MIN_NORMAL), _FP32_MAX), k)
    return k.to(tl.float32), pre.to(tl.float32), t.to(tl.float32), (1.0 / t).to(tl.float32)


@triton.jit
def row_params(row, tau_beta, FROM_MEMORY: tl.constexpr):
    """(k, pre, tau, 1/tau, beta) of row `row`. tau_beta: RowParams.args, which every kernel
    that reads tau and beta takes as one tuple argument (k0, pre0, tau0, inv_tau0, beta0,
    tau_ptr, beta_ptr, d1, d2, ts0, ts1, ts2, bs0, bs1, bs2): the launch's scalars, or the
    row's values in memory at (i0, i1, i2) = row's index in (rows / (d1 d2), d1, d2) times
    the strides."""
    k, pre, tau, inv_tau, beta, tau_ptr, beta_ptr, d1, d2, ts0, ts1, ts2, bs0, bs1, bs2 = tau_beta
    if FROM_MEMORY:
        i2 = row % d2
        i1 = (row // d2) % d1
        i0 = row // (d2 * d1)
        k, pre, tau, inv_tau = _exp2_scale(tl.load(tau_ptr + i0 * ts0 + i1 * ts1 + i2 * ts2))
        beta = tl.load(beta_ptr + i0 * bs0 + i1 * bs1 + i2 * bs2).to(tl.float32)
    return k, pre, tau, inv_tau, beta


@triton.jit
def rows_params(row, rows, tau_beta, FROM_MEMORY: tl.constexpr):
    """row_params of a block of rows (a vector `row`; indices past `rows` read the last
    row's pair), each as a (ROWS, 1) column that broadcasts against the rows' elements."""
    k, pre, tau, inv_tau, beta = row_params(tl.minimum(row, rows - 1), tau_beta, FROM_MEMORY)
    z = tl.full(row.shape, 0.0, tl.float32)
    return ((k + z)[:, None], (pre + z)[:, None], (tau + z)[:, None], (inv_tau + z)[:, None],
            (beta + z)[:, None])


class RowParams(NamedTuple):
    """row_params's `tau_beta` (a kernel's one tuple argument for them; not named `params`,
    a name Triton's argument binder uses itself) and its FROM_MEMORY."""

    args: tuple
    from_memory: bool


def scalar_params(x: torch.Tensor, tau: float, beta: float) -> RowParams:
    """One tau and beta given as floats (x stands in for the pointers, never read)."""
    k, pre = exp2_scale(tau)
    return RowParams((k, pre, float(tau), 1.0 / tau, float(beta), x, x, 1, 1, 0, 0, 0, 0, 0, 0),
                     False)


def _dims(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> list[tuple[int, tuple]]:
    """(size, per-tensor strides) of the leading dims, size-1 dims dropped and neighbours
    merged where every tensor steps through them as through one dimension."""
    dims: list[tuple[int, tuple]] = []
    for size, st in zip(shape, zip(*strides, strict=True), strict=True):
        if size == 1:
            continue
        if dims and all(prev == s * size for prev, s in zip(dims[-1][1], st, strict=True)):
            dims[-1] = (dims[-1][0] * size, st)
        else:
            dims.append((size, st))
    return dims


def memory_params(x: torch.Tensor, tau: torch.Tensor, beta: torch.Tensor) -> RowParams:
    """tau and beta tensors on x's device: 0-d, or (..., 1) broadcasting against x (..., n)
    as rows.param_layout.as_rows lays them out."""
    lead = tuple(x.shape[:-1])
    views = [v.expand(*lead, 1)[..., 0] if v.ndim else v.expand(lead) for v in (tau, beta)]
    dims = _dims(lead, [v.stride() for v in views])
    if len(dims) > 3:  # one value per row, in memory (a copy on the device, not the host)
        views = [v.reshape(-1).contiguous() for v in views]
        dims = _dims((math.prod(lead),), [v.stride() for v in views])
    dims = [(1, (0, 0))] * (3 - len(dims)) + dims
    (_, (ts0, bs0)), (d1, (ts1, bs1)), (d2, (ts2, bs2)) = dims
    return RowParams((1.0, 1.0, 1.0, 1.0, 0.0, views[0], views[1], d1, d2, ts0, ts1, ts2, bs0,
                      bs1, bs2), True)
