"""The Elastic-Softmax backward in Triton (docs/gradients.md sections 1-2).

Per row, with t = (s - m) log2(e)/tau (shifted, in base-2 units), e = exp2(t),
D' = sum e + beta' and beta' = beta exp(-m/tau):

    c     = sum g y
    dx    = y (g - c) / tau                     (0 where x < 0)
    dtau  = (c A - B + (m/tau) c (S - 1)) / tau with A = ln2 sum y t, B = ln2 sum g y t and
            S - 1 = -beta'/D'; the shift m/tau is taken out analytically, so no large z is
            ever formed and subtracted
    dbeta = -c exp(-m/tau) / D'

Rows with nothing kept give 0 for both; rows with +inf give 0 (the limit); NaN propagates.
Per-row partials go to a buffer that one program then sums in a fixed order.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .exp_family import check_tau_beta, exp2_scaled, keep, log2_arg, online_step
from .launch import (
    LaunchOptions,
    RowPlan,
    check_rows,
    current_options,
    device_sms,
    exp2_model_ulps,
    launch_items,
    launch_resident,
    note_plan,
    plan_rows,
    pow2_at_least,
    resident_args,
    resident_available,
    run,
    split_args,
)
from .memory import ld, max_nan, st, tile_mask
from .params import RowParams, memory_params, row_params, rows_params, scalar_params
from .row_parts import (
    arrive_and_wait,
    finish_item,
    leave,
    ordinary,
    partial_sum,
    publish,
    resident_item,
    row_block,
    row_start,
    split_item,
    split_lanes,
)

LN2 = tl.constexpr(0.6931471805599453)  # jit code reads only constexpr globals


@triton.jit
def _bwd_dx(x, y, g, c, tau, inv_tau, top, EXACT: tl.constexpr):
    """dx = y (g - c) / tau; 0 where x < 0 and on rows with +inf (their output is constant);
    NaN rows (top, the row's NaN-propagating kept max, is NaN) are NaN throughout, at the
    masked positions too."""
    v = y * (g - c)
    v = tl.math.div_rn(v, tau) if EXACT else v * inv_tau
    v = tl.where(top == float("inf"), 0.0, tl.where(x < 0.0, 0.0, v))
    return tl.where(top != top, float("nan"), v)


@triton.jit
def _bwd_t(s, m, y, k, pre):
    """t = (s - m) log2(e)/tau where y != 0, else 0: y t -> 0 there (masked, or exp underflowed
    while t may have overflowed to -inf) and 0 * -inf must not make A or B NaN."""
    return tl.where(y != 0.0, log2_arg(s - m, k, pre), 0.0)


@triton.jit
def _regular(top):
    """Something kept and no NaN or +inf (top: the row's NaN-propagating kept max)."""
    return ordinary(top) & (top > float("-inf"))


@triton.jit
def _ld_xyg(x_ptr, y_ptr, g_ptr, row, sx, sy, sg, idx, inside, EVEN: tl.constexpr):
    """x, y, g of row `row` at idx (or of rows `row`, an int64 column, at columns idx); lanes
    outside `inside` read x = -inf (masked), y = g = 0."""
    x = ld(row_start(x_ptr, row, sx) + idx, inside, float("-inf"), EVEN)
    y = ld(row_start(y_ptr, row, sy) + idx, inside, 0.0, EVEN)
    g = ld(row_start(g_ptr, row, sg) + idx, inside, 0.0, EVEN)
    return x, y, g


@triton.jit
def _bwd_row_partials(c, a2, b2, den, top, shift, k, pre, tau, beta,
                      EXP2_ULPS: tl.constexpr):
    """(dtau, dbeta) of one row from c, A/ln2, B/ln2, D', its NaN-propagating max and the
    shift its sums were taken with."""
    decay = exp2_scaled(-shift, k, pre, False, EXP2_ULPS)  # exp(-m/tau)
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
def _store_row_grads(part_ptr, row, rows, c, a2, b2, den, top, shift, k, pre, tau, beta,
                     EXP2_ULPS: tl.constexpr):
    """Store one row's dtau and dbeta (_bwd_row_partials) at part[row] and part[rows + row]."""
    dtau, dbeta = _bwd_row_partials(c, a2, b2, den, top, shift, k, pre, tau, beta, EXP2_ULPS)
    tl.store(part_ptr + row, dtau)
    tl.store(part_ptr + rows + row, dbeta)


@triton.jit
def _bwd_scan(x_ptr, y_ptr, g_ptr, row, sx, sy, sg, start, end, n, offs, k, pre,
              EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    """Pass 1 over columns [start, end) of row `row`: (NaN-propagating kept max, D' = sum
    exp((s - max)/tau) online as the forward's, c = sum g y)."""
    top = float("-inf")
    den = 0.0
    comp = 0.0
    c_lanes = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        x, y, g = _ld_xyg(x_ptr, y_ptr, g_ptr, row, sx, sy, sg, idx, idx < n, EVEN)
        top, den, comp = online_step(top, den, comp, keep(x, True), k, pre, EXP2_ULPS)
        c_lanes += tl.where(x < 0.0, 0.0, g * y)
    return top, den, tl.sum(c_lanes, axis=0)


@triton.jit
def _bwd_write(x_ptr, y_ptr, g_ptr, dx_ptr, row, sx, sy, sg, sdx, start, end, n, offs, c, m,
               top, k, pre, tau, inv_tau, EXACT: tl.constexpr, BLOCK: tl.constexpr,
               EVEN: tl.constexpr):
    """Pass 2 over columns [start, end) of row `row`: write dx, and return (A/ln2, B/ln2) taken
    at the row's shift m (c, top: the row's, from pass 1)."""
    a_lanes = tl.zeros([BLOCK], dtype=tl.float32)
    b_lanes = tl.zeros([BLOCK], dtype=tl.float32)
    for c0 in tl.range(start, end, BLOCK):
        idx = c0 + offs
        inside = idx < n
        x, y, g = _ld_xyg(x_ptr, y_ptr, g_ptr, row, sx, sy, sg, idx, inside, EVEN)
        st(row_start(dx_ptr, row, sdx) + idx, _bwd_dx(x, y, g, c, tau, inv_tau, top, EXACT),
           inside, EVEN)
        t = _bwd_t(keep(x, True), m, y, k, pre)
        a_lanes += y * t
        b_lanes += tl.where(x < 0.0, 0.0, g * y) * t
    return tl.sum(a_lanes, axis=0), tl.sum(b_lanes, axis=0)


@triton.jit(do_not_specialize=["PROGRAMS"])
def elastic_bwd_fused_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, rows, n, sx, sy, sg, sdx,
                             tau_beta, EXACT: tl.constexpr, EXP2_ULPS: tl.constexpr,
                             BLOCK: tl.constexpr, EVEN: tl.constexpr, FROM_MEMORY: tl.constexpr,
                             PROGRAMS):
    """x, y, g read once into registers; dx written once."""
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    for row in tl.range(tl.program_id(0), rows, PROGRAMS):
        k, pre, tau, inv_tau, beta = row_params(row, tau_beta, FROM_MEMORY)
        x, y, g = _ld_xyg(x_ptr, y_ptr, g_ptr, row, sx, sy, sg, offs, inside, EVEN)
        s = keep(x, True)
        top = max_nan(s)
        m = tl.where(_regular(top), top, 0.0)
        # den >= 1: terms an ftz exp2 flushes are lost in its rounding anyway
        den = tl.sum(exp2_scaled(s - m, k, pre, False, EXP2_ULPS), axis=0)
        gy = tl.where(x < 0.0, 0.0, g * y)
        c = tl.sum(gy, axis=0)
        dx = _bwd_dx(x, y, g, c, tau, inv_tau, top, EXACT)
        st(row_start(dx_ptr, row, sdx) + offs, dx, inside, EVEN)
        t = _bwd_t(s, m, y, k, pre)
        _store_row_grads(part_ptr, row, rows, c, tl.sum(y * t, axis=0), tl.sum(gy * t, axis=0),
                         den, top, m, k, pre, tau, beta, EXP2_ULPS)


@triton.jit(do_not_specialize=["PROGRAMS"])
def elastic_bwd_online_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, rows, n, sx, sy, sg, sdx,
                              tau_beta, EXACT: tl.constexpr, EXP2_ULPS: tl.constexpr,
                              BLOCK: tl.constexpr, EVEN: tl.constexpr, FROM_MEMORY: tl.constexpr,
                              PROGRAMS):
    """Rows streamed in BLOCK-wide chunks: x, y, g read twice, dx written once."""
    offs = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, PROGRAMS):
        k, pre, tau, inv_tau, beta = row_params(row, tau_beta, FROM_MEMORY)
        top, den, c = _bwd_scan(x_ptr, y_ptr, g_ptr, row, sx, sy, sg, 0, n, n, offs, k, pre,
                                EXP2_ULPS, BLOCK, EVEN)
        m = tl.where(_regular(top), top, 0.0)
        # pass 2: dx, and A, B with the final shift
        a2, b2 = _bwd_write(x_ptr, y_ptr, g_ptr, dx_ptr, row, sx, sy, sg, sdx, 0, n, n, offs, c,
                            m, top, k, pre, tau, inv_tau, EXACT, BLOCK, EVEN)
        _store_row_grads(part_ptr, row, rows, c, a2, b2, den, top, m, k, pre, tau, beta,
                         EXP2_ULPS)


@triton.jit(do_not_specialize=["PROGRAMS"])
def elastic_bwd_rows_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, rows, n, sx, sy, sg, sdx,
                            tau_beta, EXACT: tl.constexpr, EXP2_ULPS: tl.constexpr,
                            BLOCK: tl.constexpr, EVEN: tl.constexpr, FROM_MEMORY: tl.constexpr,
                            ROWS: tl.constexpr, PROGRAMS):
    """Short rows, ROWS at a time: x, y, g read once into registers; dx written once."""
    cols = tl.arange(0, BLOCK)
    for blk in tl.range(tl.program_id(0), tl.cdiv(rows, ROWS), PROGRAMS):
        row, at = row_block(blk, ROWS)
        k, pre, tau, inv_tau, beta = rows_params(row, rows, tau_beta, FROM_MEMORY)
        mask = tile_mask(row, rows, cols, n, ROWS, BLOCK, EVEN)
        x, y, g = _ld_xyg(x_ptr, y_ptr, g_ptr, at, sx, sy, sg, cols[None, :], mask, False)
        s = keep(x, True)
        top = max_nan(s, 1)[:, None]
        m = tl.where(_regular(top), top, 0.0)
        den = tl.sum(exp2_scaled(s - m, k, pre, False, EXP2_ULPS), axis=1)[:, None]
        gy = tl.where(x < 0.0, 0.0, g * y)
        c = tl.sum(gy, axis=1)[:, None]
        st(row_start(dx_ptr, at, sdx) + cols[None, :],
           _bwd_dx(x, y, g, c, tau, inv_tau, top, EXACT), mask, False)
        t = _bwd_t(s, m, y, k, pre)
        dtau, dbeta = _bwd_row_partials(c, tl.sum(y * t, axis=1)[:, None],
                                        tl.sum(gy * t, axis=1)[:, None], den, top, m, k, pre,
                                        tau, beta, EXP2_ULPS)
        live = (row < rows)[:, None]
        tl.store(part_ptr + row[:, None], dtau, mask=live)
        tl.store(part_ptr + rows + row[:, None], dbeta, mask=live)


# Split rows (launch.plan_rows): SPLITS programs of SPAN columns per row, three kernels.
# Phase 1 stores each (row, split)'s NaN-propagating kept max, its sum of exp((s - own
# max)/tau) and its c = sum g y; phase 2 combines the row's max and c, writes dx over its
# span and stores its A/ln2 and B/ln2 (taken at the row's shift); phase 3, one program per
# row, combines the sums into the row's dtau and dbeta. Five fp32 per (row, split):
# max, den, c, A/ln2, B/ln2. x, y, g are read twice, as on the online path.


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def elastic_bwd_split_partials_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, split_ptr, rows, n,
                                      sx, sy, sg, sdx, tau_beta, EXACT: tl.constexpr,
                                      EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr,
                                      EVEN: tl.constexpr, FROM_MEMORY: tl.constexpr, SPAN,
                                      SPLITS, SPLITS_P2: tl.constexpr, PROGRAMS):
    """Split rows, phase 1: max, D' and c of each (row, split)."""
    offs = tl.arange(0, BLOCK)
    for item in tl.range(tl.program_id(0), rows * SPLITS, PROGRAMS):
        row, start, end = split_item(item, SPLITS, SPAN, n)
        k, pre, _, _, _ = row_params(row, tau_beta, FROM_MEMORY)
        top, den, c = _bwd_scan(x_ptr, y_ptr, g_ptr, row, sx, sy, sg, start, end, n, offs, k,
                                pre, EXP2_ULPS, BLOCK, EVEN)
        at = tl.cast(item, tl.int64) * 5
        tl.store(split_ptr + at, top)
        tl.store(split_ptr + at + 1, den)
        tl.store(split_ptr + at + 2, c)


@triton.jit
def _split_row(split_ptr, row, parts, live, SPLITS,
               VOLATILE: tl.constexpr = False):
    """(max, c, the partials' base pointers, their maxes) of a split row from phase 1
    (VOLATILE: written by programs running beside this one, the resident path)."""
    base = split_ptr + (tl.cast(row, tl.int64) * SPLITS + parts) * 5
    tops = tl.load(base, mask=live, other=float("-inf"), volatile=VOLATILE)
    c = partial_sum(base, 2, live, VOLATILE)
    return max_nan(tops), c, base, tops


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def elastic_bwd_split_finish_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, split_ptr, rows, n,
                                    sx, sy, sg, sdx, tau_beta, EXACT: tl.constexpr,
                                    EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr,
                                    EVEN: tl.constexpr, FROM_MEMORY: tl.constexpr, SPAN,
                                    SPLITS, SPLITS_P2: tl.constexpr, PROGRAMS):
    """Split rows, phase 2: dx over the span, and its A/ln2, B/ln2 at the row's shift."""
    offs, parts, live = split_lanes(BLOCK, SPLITS, SPLITS_P2)
    for turn in tl.range(tl.program_id(0), rows * SPLITS, PROGRAMS):
        item, row, start, end = finish_item(turn, rows, SPLITS, SPAN, n)
        k, pre, tau, inv_tau, _ = row_params(row, tau_beta, FROM_MEMORY)
        top, c, _, _ = _split_row(split_ptr, row, parts, live, SPLITS)
        m = tl.where(_regular(top), top, 0.0)
        a2, b2 = _bwd_write(x_ptr, y_ptr, g_ptr, dx_ptr, row, sx, sy, sg, sdx, start, end, n,
                            offs, c, m, top, k, pre, tau, inv_tau, EXACT, BLOCK, EVEN)
        at = tl.cast(item, tl.int64) * 5
        tl.store(split_ptr + at + 3, a2)
        tl.store(split_ptr + at + 4, b2)


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def elastic_bwd_split_rows_kernel(part_ptr, split_ptr, rows, tau_beta,
                                  EXP2_ULPS: tl.constexpr, FROM_MEMORY: tl.constexpr,
                                  SPLITS, SPLITS_P2: tl.constexpr, PROGRAMS):
    """Split rows, phase 3: each row's dtau and dbeta from its splits' sums."""
    parts = tl.arange(0, SPLITS_P2)
    live = parts < SPLITS
    for row in tl.range(tl.program_id(0), rows, PROGRAMS):
        k, pre, tau, _, beta = row_params(row, tau_beta, FROM_MEMORY)
        _split_row_grads(part_ptr, split_ptr, row, rows, parts, live, k, pre, tau, beta,
                         SPLITS, EXP2_ULPS, False)


@triton.jit
def _split_row_grads(part_ptr, split_ptr, row, rows, parts, live, k, pre, tau, beta,
                     SPLITS, EXP2_ULPS: tl.constexpr, VOLATILE: tl.constexpr):
    """Store a split row's dtau and dbeta from its splits' five partials."""
    top, c, base, tops = _split_row(split_ptr, row, parts, live, SPLITS, VOLATILE)
    m = tl.where(_regular(top), top, 0.0)
    dens = tl.load(base + 1, mask=live, other=0.0, volatile=VOLATILE)
    own = tl.where(tops > float("-inf"), tops, 0.0)  # the shift each D' was taken at
    den = tl.sum(tl.where(dens > 0.0, dens * exp2_scaled(own - m, k, pre, False, EXP2_ULPS),
                          0.0), axis=0)
    _store_row_grads(part_ptr, row, rows, c, partial_sum(base, 3, live, VOLATILE),
                     partial_sum(base, 4, live, VOLATILE), den, top, m, k, pre, tau, beta,
                     EXP2_ULPS)


# Resident rows (launch.plan_rows): SPLITS programs a row, each holding one BLOCK of x, y
# and g in registers. Each publishes phase 1's max, D' and c of its block, waits at the
# row's barrier, writes dx and publishes its A/ln2 and B/ln2 (phase 2); the row's last
# program to leave the barrier combines the five partials into the row's dtau and dbeta
# (phase 3). x, y, g are read once; a split of one chunk computes what the split path does,
# so the results are the same bits.


@triton.jit(do_not_specialize=["SPLITS", "PROGRAMS"])
def elastic_bwd_resident_kernel(x_ptr, y_ptr, g_ptr, dx_ptr, part_ptr, split_ptr, cnt_ptr,
                                rows, n, sx, sy, sg, sdx, tau_beta, EXACT: tl.constexpr,
                                EXP2_ULPS: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr,
                                FROM_MEMORY: tl.constexpr, SPLITS, SPLITS_P2: tl.constexpr,
                                PROGRAMS):
    """Resident rows: block (item % SPLITS) of row (item // SPLITS) per work item. Needs all
    the grid's programs resident at once and a grid that is a multiple of SPLITS."""
    offs, parts, live = split_lanes(BLOCK, SPLITS, SPLITS_P2)
    for item in tl.range(tl.program_id(0), rows * SPLITS, PROGRAMS):
        row, idx, inside = resident_item(item, offs, n, SPLITS, BLOCK)
        k, pre, tau, inv_tau, beta = row_params(row, tau_beta, FROM_MEMORY)
        x, y, g = _ld_xyg(x_ptr, y_ptr, g_ptr, row, sx, sy, sg, idx, inside, EVEN)
        s = keep(x, True)
        top = max_nan(s)
        own = tl.where(top > float("-inf"), top, 0.0)
        # + 0.0 as the split path's lane accumulators start from +0.0: the same sign of zero
        gy = tl.where(x < 0.0, 0.0, g * y) + 0.0
        mine = split_ptr + tl.cast(item, tl.int64) * 5
        publish(mine, top)
        publish(mine + 1, tl.sum(exp2_scaled(s - own, k, pre, False, EXP2_ULPS), axis=0))
        publish(mine + 2, tl.sum(gy, axis=0))
        arrive_and_wait(cnt_ptr + row, SPLITS)
        row_top, c, _, _ = _split_row(split_ptr, row, parts, live, SPLITS, True)
        m = tl.where(_regular(row_top), row_top, 0.0)
        st(row_start(dx_ptr, row, sdx) + idx,
           _bwd_dx(x, y, g, c, tau, inv_tau, row_top, EXACT), inside, EVEN)
        t = _bwd_t(s, m, y, k, pre)
        publish(mine + 3, tl.sum(y * t + 0.0, axis=0))
        publish(mine + 4, tl.sum(gy * t + 0.0, axis=0))
        if leave(cnt_ptr + row, SPLITS):
            _split_row_grads(part_ptr, split_ptr, row, rows, parts, live, k, pre, tau, beta,
                             SPLITS, EXP2_ULPS, True)


@triton.jit
def sum_rows_kernel(part_ptr, out_ptr, rows, BLOCK: tl.constexpr):
    """out[k] = sum of part[k*rows : (k+1)*rows], in one fixed order (one program per k)."""
    k = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for start in tl.range(0, rows, BLOCK):
        idx = start + offs
        acc += tl.load(part_ptr + k * rows + idx, mask=idx < rows, other=0.0).to(tl.float64)
    tl.store(out_ptr + k, tl.sum(acc, axis=0).to(tl.float32))


@functools.cache
def register_cap() -> dict[str, int]:
    """The register cap of the split partials and rows kernels: {"maxnreg": 128} (two
    programs of 8 warps per SM) on Triton before 3.7, else none. The ptxas of Triton 3.6.0
    (CUDA 12.8) aims these two at 80 registers without a cap and spills 8 bytes to reach
    it (they need 89-128); 3.9.0's (12.9) fits them in 75-118 unasked, where a cap would
    only raise some (docs/triton.md, "Triton 3.6.0")."""
    try:
        major, minor = (int(v) for v in triton.__version__.split(".")[:2])
    except ValueError:  # a version this cannot read: the pinned Triton's way
        return {}
    return {"maxnreg": 128} if (major, minor) < (3, 7) else {}


def _sum_partials(part: torch.Tensor | None, rows: int, device: torch.device) -> torch.Tensor:
    """(total dtau, total dbeta) fp32 from the per-row partials, summed in a fixed order."""
    if part is None:
        return torch.zeros(2, dtype=torch.float32, device=device)
    out = torch.empty(2, dtype=torch.float32, device=device)  # sum_rows_kernel writes both
    run(sum_rows_kernel, (2,), (part, out, rows), 4, {"BLOCK": min(pow2_at_least(rows), 1024)})
    return out


def elastic_backward(y: torch.Tensor, g: torch.Tensor, x2d: torch.Tensor, tau: float,
                     beta: float, options: LaunchOptions | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dtau, dbeta) of sum(g * elastic(x)); dtau, dbeta 0-d fp32 tensors, deterministic."""
    check_tau_beta(tau, beta)
    dx, part = _backward(y, g, x2d, scalar_params(x2d, tau, beta), options)
    out = _sum_partials(part, x2d.shape[0], x2d.device)
    return dx, out[0], out[1]


def elastic_backward_params(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor,
                            tau: torch.Tensor, beta: torch.Tensor,
                            options: LaunchOptions | None = None,
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dtau, dbeta) of x (..., n) with tau and beta tensors on x's device, 0-d or (..., 1)
    broadcasting against x (read by the kernels, never by the host): dtau and dbeta fp32, one
    per row ((..., 1)), or their totals (shape (1,)) for 0-d parameters."""
    n = x.shape[-1] if x.ndim else 1
    flat = [t.reshape(-1, n) for t in (x, y, g)]
    dx, part = _backward(flat[1], flat[2], flat[0], memory_params(x, tau, beta), options)
    rows = flat[0].shape[0]
    if tau.ndim == 0 and beta.ndim == 0:
        out = _sum_partials(part, rows, x.device)
        return dx.reshape(x.shape), out[0:1], out[1:2]
    if part is None:
        part = torch.zeros(2 * rows, dtype=torch.float32, device=x.device)
    per_row = (*x.shape[:-1], 1)
    return dx.reshape(x.shape), part[:rows].reshape(per_row), part[rows:].reshape(per_row)


def _backward(y: torch.Tensor, g: torch.Tensor, x2d: torch.Tensor, params: RowParams,
              options: LaunchOptions | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dx, and the per-row (dtau, dbeta) partials concatenated (None for an empty x); params:
    where each row's tau and beta are (params.scalar_params or params.memory_params)."""
    options = options or current_options()
    rows, n = check_rows(x2d)
    if y.shape != x2d.shape or g.shape != x2d.shape:
        raise ValueError(f"x, y and g must have one shape, got {tuple(x2d.shape)}, "
                         f"{tuple(y.shape)}, {tuple(g.shape)}")
    if y.dtype != x2d.dtype or g.dtype != x2d.dtype:
        raise TypeError(f"x, y and g must have one dtype, got {x2d.dtype}, {y.dtype}, {g.dtype}")
    x2d, y, g = x2d.contiguous(), y.contiguous(), g.contiguous()
    dx = torch.empty_like(x2d)
    if not (rows and n):
        return dx, None
    part = torch.empty(2 * rows, dtype=torch.float32, device=x2d.device)
    # three arrays live in registers: half the forward's fused rows, or it spills
    chosen = plan_rows(rows, n, x2d.element_size(), options, device_sms(x2d),
                       max_fused=options.max_fused // 2, resident=resident_available(x2d))
    strides = (x2d.stride(0), y.stride(0), g.stride(0), dx.stride(0))

    def constexprs(plan_: RowPlan) -> dict:
        return {"BLOCK": plan_.block, "EVEN": n % plan_.block == 0,
                "EXACT": x2d.dtype == torch.float32, "EXP2_ULPS": exp2_model_ulps(options),
                "FROM_MEMORY": params.from_memory}

    if chosen.path == "resident":
        split, counters, extra = resident_args(chosen, rows, x2d, 5)
        args = (x2d, y, g, dx, part, split, counters, rows, n, *strides, params.args)
        if launch_resident(elastic_bwd_resident_kernel, rows, chosen.splits, args,
                           chosen.warps, {**constexprs(chosen), **extra}, counters):
            note_plan(elastic_bwd_fused_kernel, x2d, chosen)
            return dx, part
        chosen = plan_rows(rows, n, x2d.element_size(), options, device_sms(x2d),
                           max_fused=options.max_fused // 2)
    consts = constexprs(chosen)
    if chosen.path == "split":
        split, extra = split_args(chosen, rows, n, x2d, 5)
        args = (x2d, y, g, dx, part, split, rows, n, *strides, params.args)
        items = rows * chosen.splits
        launch_items(elastic_bwd_split_partials_kernel, items, args, chosen.warps,
                     {**consts, **extra, **register_cap()})
        launch_items(elastic_bwd_split_finish_kernel, items, args, chosen.warps,
                     {**consts, **extra})
        launch_items(elastic_bwd_split_rows_kernel, rows, (part, split, rows, params.args), 4,
                     {"EXP2_ULPS": consts["EXP2_ULPS"], "FROM_MEMORY": params.from_memory,
                      "SPLITS": extra["SPLITS"], "SPLITS_P2": extra["SPLITS_P2"]})
    else:
        kernel = {"fused": elastic_bwd_fused_kernel, "rows": elastic_bwd_rows_kernel,
                  "online": elastic_bwd_online_kernel}[chosen.path]
        if chosen.path == "rows":
            consts.update(ROWS=chosen.row_block, **register_cap())
        args = (x2d, y, g, dx, part, rows, n, *strides, params.args)
        launch_items(kernel, -(-rows // chosen.row_block), args, chosen.warps, consts)
    note_plan(elastic_bwd_fused_kernel, x2d, chosen)
    return dx, part
