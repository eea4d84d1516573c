"""The weight family in Triton: stablemax and symax forward.

    y_i = w_i / (const + sum_j w_j)   for weights w >= 0

The weights are multiplied by the reciprocal of a power of two near the row's largest weight
(when it exceeds 1), so neither the fp32 sum nor const can overflow and the scaling is exact.
Lanes past the row load as -inf for stablemax and 0 for symax: both weigh 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import LaunchOptions, RowKernels, normalize_rows
from .memory import ld, max_nan, st, tile_mask
from .row_parts import (
    add_compensated,
    finish_item,
    gathered_special_y,
    leave,
    ordinary,
    partial_sum,
    publish_and_gather,
    quotient,
    reciprocal,
    resident_item,
    row_block,
    row_partials,
    row_start,
    special_row,
    special_rows,
    special_y,
    split_item,
    split_lanes,
    store_partials,
)


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
def _weight_scan(xrow, start, end, n, offs, OTHER: tl.constexpr, SYMAX: tl.constexpr,
                 EXACT: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """Columns [start, end) of a row streamed in chunks: (NaN-propagating max weight, the
    power-of-two scale 1/p of that max, sum of the weights times 1/p, its compensation).
    Rescaling the sum by a ratio of powers of two is exact."""
    top = 0.0
    inv = 1.0
    den = 0.0
    comp = 0.0
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        w = _weight(ld(xrow + idx, idx < n, OTHER, EVEN), SYMAX, EXACT)
        top = tl.maximum(top, max_nan(w), propagate_nan=tl.PropagateNan.ALL)
        new_inv = tl.minimum(inv, _inv_pow2_scale(top))
        ratio = tl.math.div_rn(new_inv, inv)
        den, comp = add_compensated(den * ratio, comp * ratio,
                                    tl.sum(w * new_inv, axis=0))
        inv = new_inv
    return top, inv, den, comp


@triton.jit
def _weight_write(xrow, yrow, start, end, n, offs, inv, rden, OTHER: tl.constexpr,
                  SYMAX: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr,
                  EVEN: tl.constexpr):
    """y over columns [start, end) of an ordinary row: w inv / den, rden the reciprocal of
    den for quotient."""
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        inside = idx < n
        w = _weight(ld(xrow + idx, inside, OTHER, EVEN), SYMAX, EXACT)
        st(yrow + idx, quotient(w * inv, rden, EXACT), inside, EVEN)


@triton.jit
def _weight_count_inf(xrow, start, end, n, offs, OTHER: tl.constexpr, SYMAX: tl.constexpr,
                      EXACT: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """The number of +inf weights in columns [start, end) of a row (a second read)."""
    n_inf = tl.full([], 0.0, tl.float32)
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        w = _weight(ld(xrow + idx, idx < n, OTHER, EVEN), SYMAX, EXACT)
        n_inf += tl.sum((w == float("inf")).to(tl.float32), axis=0)
    return n_inf


@triton.jit
def _weight_write_special(xrow, yrow, start, end, n, offs, n_inf, top, OTHER: tl.constexpr,
                          SYMAX: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr,
                          EVEN: tl.constexpr):
    """y over columns [start, end) of a special row (special_y), n_inf the row's count of
    +inf weights."""
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        inside = idx < n
        w = _weight(ld(xrow + idx, inside, OTHER, EVEN), SYMAX, EXACT)
        st(yrow + idx, special_y(w == float("inf"), n_inf, top), inside, EVEN)


@triton.jit(do_not_specialize=["PROGRAMS"])
def weight_fused_kernel(x_ptr, y_ptr, rows, n, sx, sy, const, OTHER: tl.constexpr,
                        SYMAX: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr,
                        EVEN: tl.constexpr, PROGRAMS):
    """The whole row in registers: one read and one write per element."""
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    for row in tl.range(tl.program_id(0), rows, PROGRAMS):
        w = _weight(ld(row_start(x_ptr, row, sx) + offs, inside, OTHER, EVEN), SYMAX, EXACT)
        top = max_nan(w)
        if ordinary(top):
            inv = _inv_pow2_scale(top)
            ws = w * inv
            den = tl.sum(ws, axis=0) + const * inv
            y = quotient(ws, reciprocal(tl.where(den > 0.0, den, 1.0), EXACT), EXACT)
        else:
            y = special_row(w, top)
        st(row_start(y_ptr, row, sy) + offs, y, inside, EVEN)


@triton.jit(do_not_specialize=["PROGRAMS"])
def weight_online_kernel(x_ptr, y_ptr, rows, n, sx, sy, const, OTHER: tl.constexpr,
                         SYMAX: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr,
                         EVEN: tl.constexpr, PROGRAMS):
    """Rows streamed in BLOCK-wide chunks: two reads and one write per element."""
    offs = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, PROGRAMS):
        xrow = row_start(x_ptr, row, sx)
        yrow = row_start(y_ptr, row, sy)
        # pass 1: running max and power-of-two scale
        top, inv, den, _ = _weight_scan(xrow, 0, n, n, offs, OTHER, SYMAX, EXACT, BLOCK, EVEN)
        if ordinary(top):
            den += const * inv
            rden = reciprocal(tl.where(den > 0.0, den, 1.0), EXACT)
            # pass 2: normalize and write
            _weight_write(xrow, yrow, 0, n, n, offs, inv, rden, OTHER, SYMAX, EXACT, BLOCK,
                          EVEN)
        else:
            n_inf = _weight_count_inf(xrow, 0, n, n, offs, OTHER, SYMAX, EXACT, BLOCK, EVEN)
            _weight_write_special(xrow, yrow, 0, n, n, offs, n_inf, top, OTHER, SYMAX, EXACT,
                                  BLOCK, EVEN)


@triton.jit(do_not_specialize=["PROGRAMS"])
def weight_rows_kernel(x_ptr, y_ptr, rows, n, sx, sy, const, OTHER: tl.constexpr,
                       SYMAX: tl.constexpr, EXACT: tl.constexpr, BLOCK: tl.constexpr,
                       EVEN: tl.constexpr, ROWS: tl.constexpr, PROGRAMS):
    """Short rows, ROWS at a time in registers: one read and one write per element."""
    cols = tl.arange(0, BLOCK)
    for blk in tl.range(tl.program_id(0), tl.cdiv(rows, ROWS), PROGRAMS):
        row, at = row_block(blk, ROWS)
        mask = tile_mask(row, rows, cols, n, ROWS, BLOCK, EVEN)
        w = _weight(ld(row_start(x_ptr, at, sx) + cols[None, :], mask, OTHER, False), SYMAX,
                    EXACT)
        top = max_nan(w, 1)[:, None]
        ok = ordinary(top)
        inv = _inv_pow2_scale(tl.where(ok, top, 1.0))
        ws = w * inv
        den = tl.sum(ws, axis=1)[:, None] + const * inv
        y = special_rows(quotient(ws, reciprocal(tl.where(den > 0.0, den, 1.0), EXACT), EXACT),
                         ok, w, top)
        st(row_start(y_ptr, at, sy) + cols[None, :], y, mask, False)


# Split rows, as exp_family's: phase 1 stores each (row, split)'s NaN-propagating max weight,
# its sum of weights scaled by its own power of two (_inv_pow2_scale of that max) and its
# +inf count; phase 2 rescales the sums to the row's power of two (exact) and writes.


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def weight_split_partials_kernel(x_ptr, y_ptr, part_ptr, rows, n, sx, sy, const,
                                 OTHER: tl.constexpr, SYMAX: tl.constexpr, EXACT: tl.constexpr,
                                 BLOCK: tl.constexpr, EVEN: tl.constexpr, SPAN, SPLITS,
                                 SPLITS_P2: tl.constexpr, PROGRAMS):
    """Split rows, phase 1: the partials of each (row, split)."""
    offs = tl.arange(0, BLOCK)
    for item in tl.range(tl.program_id(0), rows * SPLITS, PROGRAMS):
        row, start, end = split_item(item, SPLITS, SPAN, n)
        xrow = row_start(x_ptr, row, sx)
        top, _, den, _ = _weight_scan(xrow, start, end, n, offs, OTHER, SYMAX, EXACT, BLOCK,
                                      EVEN)
        n_inf = tl.full([], 0.0, tl.float32)
        if top == float("inf"):  # a +inf row: count its infinities (rare; a second read)
            n_inf = _weight_count_inf(xrow, start, end, n, offs, OTHER, SYMAX, EXACT, BLOCK,
                                      EVEN)
        store_partials(part_ptr, item, top, den, n_inf)


@triton.jit
def _weight_combine(top, tops, dens, const, EXACT: tl.constexpr):
    """(the row's scale, reciprocal for quotient) of an ordinary split row from its splits'
    maxima and sums (each scaled by its own power of two) and the row's maximum top."""
    inv = _inv_pow2_scale(top)
    # each sum was scaled by its own 1/2^e >= the row's: the ratio is a power of two
    den = tl.sum(dens * tl.math.div_rn(inv, _inv_pow2_scale(tops)), axis=0) + const * inv
    return inv, reciprocal(tl.where(den > 0.0, den, 1.0), EXACT)


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def weight_split_finish_kernel(x_ptr, y_ptr, part_ptr, rows, n, sx, sy, const,
                               OTHER: tl.constexpr, SYMAX: tl.constexpr, EXACT: tl.constexpr,
                               BLOCK: tl.constexpr, EVEN: tl.constexpr, SPAN, SPLITS,
                               SPLITS_P2: tl.constexpr, PROGRAMS):
    """Split rows, phase 2: combine the row's partials, write the span."""
    offs, parts, live = split_lanes(BLOCK, SPLITS, SPLITS_P2)
    for turn in tl.range(tl.program_id(0), rows * SPLITS, PROGRAMS):
        _, row, start, end = finish_item(turn, rows, SPLITS, SPAN, n)
        xrow = row_start(x_ptr, row, sx)
        yrow = row_start(y_ptr, row, sy)
        base, tops, top = row_partials(part_ptr, row, parts, live, SPLITS, 3, 0.0, False)
        if ordinary(top):
            inv, rden = _weight_combine(top, tops, tl.load(base + 1, mask=live, other=0.0),
                                        const, EXACT)
            _weight_write(xrow, yrow, start, end, n, offs, inv, rden, OTHER, SYMAX, EXACT,
                          BLOCK, EVEN)
        else:
            _weight_write_special(xrow, yrow, start, end, n, offs,
                                  partial_sum(base, 2, live, False), top, OTHER, SYMAX, EXACT,
                                  BLOCK, EVEN)


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def weight_resident_kernel(x_ptr, y_ptr, part_ptr, cnt_ptr, rows, n, sx, sy, const,
                           OTHER: tl.constexpr, SYMAX: tl.constexpr, EXACT: tl.constexpr,
                           BLOCK: tl.constexpr, EVEN: tl.constexpr, SPLITS,
                           SPLITS_P2: tl.constexpr, PROGRAMS):
    """Resident rows, as exp_family's: each program publishes the split partials of the block
    it holds, waits for its row's programs, combines and writes from registers. Needs all the
    grid's programs resident at once and a grid that is a multiple of SPLITS."""
    offs, parts, live = split_lanes(BLOCK, SPLITS, SPLITS_P2)
    for item in tl.range(tl.program_id(0), rows * SPLITS, PROGRAMS):
        row, idx, inside = resident_item(item, offs, n, SPLITS, BLOCK)
        w = _weight(ld(row_start(x_ptr, row, sx) + idx, inside, OTHER, EVEN), SYMAX, EXACT)
        top = tl.maximum(0.0, max_nan(w), propagate_nan=tl.PropagateNan.ALL)
        base, tops, row_top = publish_and_gather(part_ptr, cnt_ptr, item, row, top,
                                                 tl.sum(w * _inv_pow2_scale(top), axis=0), w,
                                                 parts, live, SPLITS, 0.0)
        if ordinary(row_top):
            inv, rden = _weight_combine(row_top, tops,
                                        tl.load(base + 1, mask=live, other=0.0, volatile=True),
                                        const, EXACT)
            y = quotient(w * inv, rden, EXACT)
        else:
            y = gathered_special_y(w, base, live, row_top)
        leave(cnt_ptr + row, SPLITS)
        st(row_start(y_ptr, row, sy) + idx, y, inside, EVEN)


WEIGHT_KERNELS = RowKernels(weight_fused_kernel, weight_rows_kernel, weight_online_kernel,
                            weight_split_partials_kernel, weight_split_finish_kernel, fields=3,
                            resident=weight_resident_kernel)


def _weight_normalize(x: torch.Tensor, const: float, symax: bool,
                      options: LaunchOptions | None) -> torch.Tensor:
    return normalize_rows(x, WEIGHT_KERNELS, (float(const),), options,
                          OTHER=0.0 if symax else float("-inf"), SYMAX=symax)


def stablemax_forward(x2d: torch.Tensor, options: LaunchOptions | None = None) -> torch.Tensor:
    """Stablemax along the rows, weights scaled by a power of two near the row maximum."""
    return _weight_normalize(x2d, 0.0, False, options)


def symax_forward(x2d: torch.Tensor, eta: float,
                  options: LaunchOptions | None = None) -> torch.Tensor:
    """Symax along the rows: |x| / (eta + sum |x|), scaled by a power of two near max |x|."""
    if not (eta >= 0 and eta < float("inf")):
        raise ValueError(f"eta must be finite and >= 0, got {eta!r}")
    return _weight_normalize(x2d, eta, True, options)
