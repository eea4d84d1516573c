"""The exp family in Triton: elastic, softmax and softmax1 forward, and their exponential.

    y_i = exp((s_i - m)/tau) / (sum_j exp((s_j - m)/tau) + beta exp(-m/tau))

NONNEG: negatives masked to -inf (elastic) rather than only -inf; FLOOR0: m = max(m, 0)
(softmax1); OFFSET: add the rescaled constant beta exp(-m/tau) to the denominator. Every kernel
computes and accumulates in fp32, rounds once on the store and follows the special-value policy
of docs/definitions.md section 3. Divisions that set the result use `tl.math.div_rn` (IEEE
round-to-nearest); a plain `/` is approximate on NVIDIA GPUs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import LaunchOptions, RowKernels, current_options, exp2_model_ulps, normalize_rows
from .memory import ld, max_nan, st, tile_mask
from .params import RowParams, memory_params, row_params, rows_params, scalar_params
from .row_parts import (
    add_compensated,
    finish_item,
    leave,
    ordinary,
    partial_sum,
    publish_and_gather,
    quotient,
    reciprocal,
    row_partials,
    special_row,
    special_rows,
    special_y,
    split_item,
    split_lanes,
    store_partials,
)


@triton.jit
def log2_arg(d, k, pre):
    """d log2(e) / tau, as (d * pre) * k with k and pre from exp2_scale (pre = 1 but for a
    tau so small or large that k alone would leave fp32's normal range)."""
    return (d * pre) * k


# Under the interpreter tl.exp2 is NumPy's (nearly correctly rounded, with subnormals); on an
# NVIDIA GPU it is ex2.approx.ftz. With EXP2_ULPS >= 0 (LaunchOptions.exp2_ulps, interpreter
# only) it models the GPU's: results below 2^-126 flush to 0 and every other normal result moves
# EXP2_ULPS ulps up or down (by the argument's low bit), so the budgets can be checked against
# an approximate ex2 without a GPU.


@triton.jit
def exp2(v, SUBNORMAL: tl.constexpr, EXP2_ULPS: tl.constexpr):
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


# Below exp2 rather than with the imports above, so that exp2 keeps its first line: the
# attention kernels call it, and Triton keys their compiled code on each function's source
# and first line.
from .row_parts import gathered_special_y, resident_item, row_block, row_start  # noqa: E402


@triton.jit
def exp2_scaled(d, k, pre, SUBNORMAL: tl.constexpr, EXP2_ULPS: tl.constexpr):
    """exp(d / tau)."""
    return exp2(log2_arg(d, k, pre), SUBNORMAL, EXP2_ULPS)


@triton.jit
def keep(x, NONNEG: tl.constexpr):
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
def _exp_den(den, shift, k, beta, OFFSET: tl.constexpr, pre,
             EXP2_ULPS: tl.constexpr):
    """The denominator sum exp((s - m)/tau) + beta exp(-m/tau), 1 when it is 0 (0/0 -> 0)."""
    if OFFSET:
        den += beta * exp2_scaled(-shift, k, pre, False, EXP2_ULPS)
    return tl.where(den > 0.0, den, 1.0)


@triton.jit
def online_step(top, den, comp, s, k, pre, EXP2_ULPS: tl.constexpr):
    """One chunk of an online pass: the running NaN-propagating max and den = sum
    exp((s - max)/tau) with its compensation comp, both rescaled by exp((old - new)/tau) when
    the max grows."""
    new = tl.maximum(top, max_nan(s), propagate_nan=tl.PropagateNan.ALL)
    m = tl.where(new > float("-inf"), new, 0.0)
    e = exp2_scaled(s - m, k, pre, False, EXP2_ULPS)
    scale = exp2_scaled(top - m, k, pre, False, EXP2_ULPS)
    den, comp = add_compensated(den * scale, comp * scale, tl.sum(e, axis=0))
    return new, den, comp


@triton.jit
def _exp_scan(xrow, start, end, n, offs, k, pre, NONNEG: tl.constexpr,
              EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """Columns [start, end) of a row streamed in chunks (online_step): (NaN-propagating
    kept max, den = sum exp((s - max)/tau), den's compensation)."""
    top = float("-inf")
    den = 0.0
    comp = 0.0
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        s = keep(ld(xrow + idx, idx < n, float("-inf"), EVEN), NONNEG)
        top, den, comp = online_step(top, den, comp, s, k, pre, EXP2_ULPS)
    return top, den, comp


@triton.jit
def _exp_write(xrow, yrow, start, end, n, offs, shift, rden, k, pre, NONNEG: tl.constexpr,
               EXACT: tl.constexpr, SUBNORMAL: tl.constexpr, EXP2_ULPS: tl.constexpr,
               BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """y over columns [start, end) of an ordinary row: exp((s - shift)/tau) / den, rden the
    reciprocal of den for quotient."""
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        inside = idx < n
        s = keep(ld(xrow + idx, inside, float("-inf"), EVEN), NONNEG)
        e = exp2_scaled(s - shift, k, pre, SUBNORMAL, EXP2_ULPS)
        st(yrow + idx, quotient(e, rden, EXACT), inside, EVEN)


@triton.jit
def _exp_count_inf(xrow, start, end, n, offs, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """The number of +inf in columns [start, end) of a row (a second read)."""
    n_inf = tl.full([], 0.0, tl.float32)
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        x = ld(xrow + idx, idx < n, float("-inf"), EVEN)
        n_inf += tl.sum((x == float("inf")).to(tl.float32), axis=0)
    return n_inf


@triton.jit
def _exp_write_special(xrow, yrow, start, end, n, offs, n_inf, top, BLOCK: tl.constexpr,
                       EVEN: tl.constexpr):
    """y over columns [start, end) of a special row (special_y), n_inf the row's +inf
    count."""
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        inside = idx < n
        x = ld(xrow + idx, inside, float("-inf"), EVEN)
        st(yrow + idx, special_y(x == float("inf"), n_inf, top), inside, EVEN)


@triton.jit(do_not_specialize=["PROGRAMS"])
def exp_fused_kernel(x_ptr, y_ptr, rows, n, sx, sy, tau_beta, NONNEG: tl.constexpr,
                     FLOOR0: tl.constexpr, OFFSET: tl.constexpr, EXACT: tl.constexpr,
                     SUBNORMAL: tl.constexpr, EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr,
                     EVEN: tl.constexpr, FROM_MEMORY: tl.constexpr, PROGRAMS):
    """The whole row in registers: one read and one write per element."""
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    for row in tl.range(tl.program_id(0), rows, PROGRAMS):
        k, pre, _, _, beta = row_params(row, tau_beta, FROM_MEMORY)
        x = ld(row_start(x_ptr, row, sx) + offs, inside, float("-inf"), EVEN)
        s = keep(x, NONNEG)
        top = max_nan(s)
        if ordinary(top):
            shift = _exp_shift(top, FLOOR0)
            e = exp2_scaled(s - shift, k, pre, SUBNORMAL, EXP2_ULPS)
            den = _exp_den(tl.sum(e, axis=0), shift, k, beta, OFFSET, pre, EXP2_ULPS)
            y = quotient(e, reciprocal(den, EXACT), EXACT)
        else:
            y = special_row(x, top)
        st(row_start(y_ptr, row, sy) + offs, y, inside, EVEN)


@triton.jit(do_not_specialize=["PROGRAMS"])
def exp_online_kernel(x_ptr, y_ptr, rows, n, sx, sy, tau_beta, NONNEG: tl.constexpr,
                      FLOOR0: tl.constexpr, OFFSET: tl.constexpr, EXACT: tl.constexpr,
                      SUBNORMAL: tl.constexpr, EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr,
                      EVEN: tl.constexpr, FROM_MEMORY: tl.constexpr, PROGRAMS):
    """Rows streamed in BLOCK-wide chunks: two reads and one write per element."""
    offs = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, PROGRAMS):
        k, pre, _, _, beta = row_params(row, tau_beta, FROM_MEMORY)
        xrow = row_start(x_ptr, row, sx)
        yrow = row_start(y_ptr, row, sy)
        # pass 1: running NaN-propagating max and den = sum exp((s - max)/tau), rescaled by
        # exp((old - new)/tau) whenever the max grows
        top, den, _ = _exp_scan(xrow, 0, n, n, offs, k, pre, NONNEG, EXP2_ULPS, BLOCK, EVEN)
        if ordinary(top):
            shift = _exp_shift(top, FLOOR0)
            if FLOOR0:  # pass 1 shifted by the max alone
                den = den * exp2_scaled(_exp_shift(top, False) - shift, k, pre, False, EXP2_ULPS)
            rden = reciprocal(_exp_den(den, shift, k, beta, OFFSET, pre, EXP2_ULPS), EXACT)
            # pass 2: normalize and write
            _exp_write(xrow, yrow, 0, n, n, offs, shift, rden, k, pre, NONNEG, EXACT,
                       SUBNORMAL, EXP2_ULPS, BLOCK, EVEN)
        else:
            n_inf = _exp_count_inf(xrow, 0, n, n, offs, BLOCK, EVEN)
            _exp_write_special(xrow, yrow, 0, n, n, offs, n_inf, top, BLOCK, EVEN)


@triton.jit(do_not_specialize=["PROGRAMS"])
def exp_rows_kernel(x_ptr, y_ptr, rows, n, sx, sy, tau_beta, NONNEG: tl.constexpr,
                    FLOOR0: tl.constexpr, OFFSET: tl.constexpr, EXACT: tl.constexpr,
                    SUBNORMAL: tl.constexpr, EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr,
                    EVEN: tl.constexpr, FROM_MEMORY: tl.constexpr, ROWS: tl.constexpr,
                    PROGRAMS):
    """Short rows, ROWS at a time in registers: one read and one write per element. A block
    whose rows are all ordinary takes no special-value select; one with a special row selects
    per row."""
    cols = tl.arange(0, BLOCK)
    for blk in tl.range(tl.program_id(0), tl.cdiv(rows, ROWS), PROGRAMS):
        row, at = row_block(blk, ROWS)
        mask = tile_mask(row, rows, cols, n, ROWS, BLOCK, EVEN)
        k, pre, _, _, beta = rows_params(row, rows, tau_beta, FROM_MEMORY)
        x = ld(row_start(x_ptr, at, sx) + cols[None, :], mask, float("-inf"), False)
        s = keep(x, NONNEG)
        top = max_nan(s, 1)[:, None]
        ok = ordinary(top)
        shift = _exp_shift(tl.where(ok, top, 0.0), FLOOR0)
        e = exp2_scaled(s - shift, k, pre, SUBNORMAL, EXP2_ULPS)
        den = _exp_den(tl.sum(e, axis=1)[:, None], shift, k, beta, OFFSET, pre, EXP2_ULPS)
        y = special_rows(quotient(e, reciprocal(den, EXACT), EXACT), ok, x, top)
        st(row_start(y_ptr, at, sy) + cols[None, :], y, mask, False)


# Split rows (launch.plan_rows: too few rows to fill the GPU): each row is covered by SPLITS
# programs of SPAN columns. Phase 1 writes each program's partials (its chunk's
# NaN-propagating max, its sum of exp((s - own max)/tau), its +inf count) to `part`, three
# fp32 per (row, split); phase 2 combines a row's partials (rescaling each sum to the row's
# shift) and writes its span. Two reads and one write, as the online path.


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def exp_split_partials_kernel(x_ptr, y_ptr, part_ptr, rows, n, sx, sy, tau_beta,
                              NONNEG: tl.constexpr, FLOOR0: tl.constexpr, OFFSET: tl.constexpr,
                              EXACT: tl.constexpr, SUBNORMAL: tl.constexpr,
                              EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr,
                              FROM_MEMORY: tl.constexpr, SPAN, SPLITS,
                              SPLITS_P2: tl.constexpr, PROGRAMS):
    """Split rows, phase 1: the partials of each (row, split)."""
    offs = tl.arange(0, BLOCK)
    for item in tl.range(tl.program_id(0), rows * SPLITS, PROGRAMS):
        row, start, end = split_item(item, SPLITS, SPAN, n)
        k, pre, _, _, _ = row_params(row, tau_beta, FROM_MEMORY)
        xrow = row_start(x_ptr, row, sx)
        top, den, _ = _exp_scan(xrow, start, end, n, offs, k, pre, NONNEG, EXP2_ULPS, BLOCK,
                                EVEN)
        n_inf = tl.full([], 0.0, tl.float32)
        if top == float("inf"):  # a +inf row: count its infinities (rare; a second read)
            n_inf = _exp_count_inf(xrow, start, end, n, offs, BLOCK, EVEN)
        store_partials(part_ptr, item, top, den, n_inf)


@triton.jit
def _exp_combine(top, tops, dens, k, pre, beta, FLOOR0: tl.constexpr, OFFSET: tl.constexpr,
                 EXACT: tl.constexpr, EXP2_ULPS: tl.constexpr):
    """(shift, reciprocal for quotient) of an ordinary split row from its splits' maxima and
    sums (each taken at its own shift) and the row's maximum top."""
    shift = _exp_shift(top, FLOOR0)
    own = tl.where(tops > float("-inf"), tops, 0.0)  # the shift each sum was taken at
    # a split with nothing kept has den 0 (and its rescale may overflow): it adds 0
    scaled = tl.where(dens > 0.0, dens * exp2_scaled(own - shift, k, pre, False, EXP2_ULPS), 0.0)
    rden = reciprocal(_exp_den(tl.sum(scaled, axis=0), shift, k, beta, OFFSET, pre, EXP2_ULPS),
                      EXACT)
    return shift, rden


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def exp_split_finish_kernel(x_ptr, y_ptr, part_ptr, rows, n, sx, sy, tau_beta,
                            NONNEG: tl.constexpr, FLOOR0: tl.constexpr, OFFSET: tl.constexpr,
                            EXACT: tl.constexpr, SUBNORMAL: tl.constexpr,
                            EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr,
                            FROM_MEMORY: tl.constexpr, SPAN, SPLITS,
                            SPLITS_P2: tl.constexpr, PROGRAMS):
    """Split rows, phase 2: combine the row's partials, write the span."""
    offs, parts, live = split_lanes(BLOCK, SPLITS, SPLITS_P2)
    for turn in tl.range(tl.program_id(0), rows * SPLITS, PROGRAMS):
        _, row, start, end = finish_item(turn, rows, SPLITS, SPAN, n)
        k, pre, _, _, beta = row_params(row, tau_beta, FROM_MEMORY)
        xrow = row_start(x_ptr, row, sx)
        yrow = row_start(y_ptr, row, sy)
        base, tops, top = row_partials(part_ptr, row, parts, live, SPLITS, 3, float("-inf"),
                                       False)
        if ordinary(top):
            shift, rden = _exp_combine(top, tops, tl.load(base + 1, mask=live, other=0.0), k,
                                       pre, beta, FLOOR0, OFFSET, EXACT, EXP2_ULPS)
            _exp_write(xrow, yrow, start, end, n, offs, shift, rden, k, pre, NONNEG, EXACT,
                       SUBNORMAL, EXP2_ULPS, BLOCK, EVEN)
        else:
            _exp_write_special(xrow, yrow, start, end, n, offs, partial_sum(base, 2, live, False),
                               top, BLOCK, EVEN)


# Resident rows (launch.plan_rows): SPLITS programs a row, each holding one BLOCK of it in
# registers. Each publishes the split phase 1's three partials of its block, waits at the
# row's barrier (rows.arrive_and_wait), combines the row's partials as phase 2 does and
# writes its block from registers: one read and one write. A split of one chunk computes its
# partials exactly as the split path does, so the results are the same bits.


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def exp_resident_kernel(x_ptr, y_ptr, part_ptr, cnt_ptr, rows, n, sx, sy, tau_beta,
                        NONNEG: tl.constexpr, FLOOR0: tl.constexpr, OFFSET: tl.constexpr,
                        EXACT: tl.constexpr, SUBNORMAL: tl.constexpr, EXP2_ULPS: tl.constexpr,
                        BLOCK: tl.constexpr, EVEN: tl.constexpr, FROM_MEMORY: tl.constexpr,
                        SPLITS, SPLITS_P2: tl.constexpr, PROGRAMS):
    """Resident rows: block (item % SPLITS) of row (item // SPLITS) per work item. Needs all
    the grid's programs resident at once and a grid that is a multiple of SPLITS (a row's
    programs then share a wave)."""
    offs, parts, live = split_lanes(BLOCK, SPLITS, SPLITS_P2)
    for item in tl.range(tl.program_id(0), rows * SPLITS, PROGRAMS):
        row, idx, inside = resident_item(item, offs, n, SPLITS, BLOCK)
        k, pre, _, _, beta = row_params(row, tau_beta, FROM_MEMORY)
        x = ld(row_start(x_ptr, row, sx) + idx, inside, float("-inf"), EVEN)
        s = keep(x, NONNEG)
        top = max_nan(s)
        own = tl.where(top > float("-inf"), top, 0.0)
        den = tl.sum(exp2_scaled(s - own, k, pre, False, EXP2_ULPS), axis=0)
        base, tops, row_top = publish_and_gather(part_ptr, cnt_ptr, item, row, top, den, x,
                                                 parts, live, SPLITS, float("-inf"))
        if ordinary(row_top):
            dens = tl.load(base + 1, mask=live, other=0.0, volatile=True)
            shift, rden = _exp_combine(row_top, tops, dens, k, pre, beta, FLOOR0, OFFSET, EXACT,
                                       EXP2_ULPS)
            y = quotient(exp2_scaled(s - shift, k, pre, SUBNORMAL, EXP2_ULPS), rden, EXACT)
        else:
            y = gathered_special_y(x, base, live, row_top)
        leave(cnt_ptr + row, SPLITS)
        st(row_start(y_ptr, row, sy) + idx, y, inside, EVEN)


EXP_KERNELS = RowKernels(exp_fused_kernel, exp_rows_kernel, exp_online_kernel,
                         exp_split_partials_kernel, exp_split_finish_kernel, fields=3,
                         resident=exp_resident_kernel)


def exp_normalize(x: torch.Tensor, *, tau: float, beta: float, nonneg: bool, floor0: bool,
                  offset: bool, options: LaunchOptions | None = None,
                  subnormal: bool | None = None, params: RowParams | None = None
                  ) -> torch.Tensor:
    """The exp family's forward on the rows of x. subnormal: form exp2 results below 2^-126
    (default: for fp32 and bf16 outputs; fp16's subnormals end at 2^-24, where a flushed exp2
    is exact). params: params.memory_params's arguments, whose tau and beta replace the
    floats. (Without them the kernels never read a parameter pointer: x stands in, as an
    allocated dummy would be a fill kernel on every call, 2 us of a 7 us in-cache launch on an
    H100.)"""
    options = options or current_options()
    params = params or scalar_params(x, tau, beta)
    return normalize_rows(x, EXP_KERNELS, (params.args,), options,
                          NONNEG=nonneg, FLOOR0=floor0, OFFSET=offset,
                          SUBNORMAL=x.dtype != torch.float16 if subnormal is None else subnormal,
                          EXP2_ULPS=exp2_model_ulps(options), FROM_MEMORY=params.from_memory)


def check_tau_beta(tau: float, beta: float) -> None:
    """ValueError unless tau is finite and > 0 and beta finite and >= 0."""
    if not (tau > 0 and tau < float("inf")):
        raise ValueError(f"tau must be finite and > 0, got {tau!r}")
    if not (beta >= 0 and beta < float("inf")):
        raise ValueError(f"beta must be finite and >= 0, got {beta!r}")


def elastic_forward(x2d: torch.Tensor, tau: float, beta: float,
                    options: LaunchOptions | None = None) -> torch.Tensor:
    """Elastic-Softmax of a 2-D tensor along its rows: a new tensor of the same shape/dtype."""
    check_tau_beta(tau, beta)
    return exp_normalize(x2d, tau=tau, beta=beta, nonneg=True, floor0=False, offset=beta > 0,
                         options=options)


def elastic_forward_params(x: torch.Tensor, tau: torch.Tensor, beta: torch.Tensor,
                           options: LaunchOptions | None = None) -> torch.Tensor:
    """Elastic-Softmax of x (..., n) along its last dimension with tau and beta tensors on
    x's device, 0-d or (..., 1) broadcasting against x: read by the kernels, never by the
    host. x is contiguous (rows of n)."""
    x2d = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    y = exp_normalize(x2d, tau=1.0, beta=0.0, nonneg=True, floor0=False, offset=True,
                      options=options, params=memory_params(x, tau, beta))
    return y.reshape(x.shape)


def softmax_forward(x2d: torch.Tensor, options: LaunchOptions | None = None) -> torch.Tensor:
    """Safe softmax along the rows: shifted by the max; an all -inf row gives zeros."""
    return exp_normalize(x2d, tau=1.0, beta=0.0, nonneg=False, floor0=False, offset=False,
                         options=options)


def softmax1_forward(x2d: torch.Tensor, options: LaunchOptions | None = None) -> torch.Tensor:
    """Softmax1 along the rows: shift m = max(max x, 0), the 1 rescaled to exp(-m)."""
    return exp_normalize(x2d, tau=1.0, beta=1.0, nonneg=False, floor0=True, offset=True,
                         options=options)
