"""The fast reference for gradients: dx and the parameter gradients with proven bounds.

For an exp-normalize member with upstream gradient g (docs/gradients.md section 1), in the
shifted form z_i = (x_i - m)/tau, S = sum_kept exp(z_j) + offset exp(-m/tau):

    c = sum_i g_i y_i,   dx_k = y_k (g_k - c) / tau   (0 where x_k is not kept)
    dtau = sum_i g_i y_i (mean - z_i) / tau,   mean = sum_k y_k z_k - w m/tau,  w = offset exp(-m/tau)/S
    doffset = -c exp(-m/tau) / S

each evaluated in double-double (numerics/dd.py) with an absolute error bound carried
beside every quantity (docs/numerics.md section 6.3). dx is certified per element as the
forward outputs are; a parameter's gradient, summed over rows, when its bound is at most
CERTIFY_ULP units of the working precision relative to its value. Cancellation (g_k close
to c, a gradient summing to nearly 0) shows up as a bound too large to certify, and those
rows go to mpmath.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..functions.base import OFFSET, ROW_FINITE, ROW_NAN, TEMPERATURE, Function
from . import dd
from .certified import (
    ABS_FLOOR,
    CERTIFY_ULP,
    SLACK,
    Bounded,
    Denominator,
    Shift,
    certified_rows,
    certify,
    exp_forward,
    scaled,
    subnormal_floor,
)
from .dtypes import FloatFormat, work_format
from .row_blocks import rows_of
from .truth import GradTruth

CHUNK = 1 << 13  # elements of whole rows handled at once (a longer row is one chunk)
TINY = 2.0**-960  # below this a dd's lo part is subnormal
CUT = 2.0**-1086  # exp(z) |z| for every z below dd.EXP_MIN, where the exps are 0


def row_chunks(r: int, n: int) -> Iterator[slice]:
    per = max(1, CHUNK // max(n, 1))
    for i in range(0, r, per):
        yield slice(i, min(r, i + per))


def floor_of(v: np.ndarray, *factors: np.ndarray) -> np.ndarray:
    """Absolute slack where a computed value lies in float64's subnormal tail, or is 0 while
    the factors it is the product of are not (it underflowed)."""
    live = v != 0
    if factors:
        live = live | np.logical_and.reduce([np.asarray(f) != 0 for f in factors])
    return np.where(live & (np.abs(v) < TINY), ABS_FLOOR, 0.0)


@dataclass
class RowSums:
    """A row quantity as a dd with its absolute error bound."""

    h: np.ndarray
    lo: np.ndarray
    bound: np.ndarray


def tree_sum(h: np.ndarray, lo: np.ndarray, bound: np.ndarray) -> RowSums:
    """Row sums of dd terms with bounds: the terms' bounds plus each tree level's."""
    sh, sl = dd.sum_rows(h, lo)
    levels = dd.depth(h.shape[1])
    return RowSums(sh, sl, bound.sum(axis=1) + levels * dd.ADD_DD * dd.U2 * np.abs(h).sum(axis=1))


@dataclass
class GradChunk:
    dx_h: np.ndarray
    dx_l: np.ndarray
    dx_bound: np.ndarray
    dp_h: np.ndarray  # (r, p)
    dp_l: np.ndarray
    dp_bound: np.ndarray


def _chunk(fn: Function, x: np.ndarray, g: np.ndarray, y: Bounded, sh: Shift,
           den: Denominator) -> GradChunk:
    """Gradients of the rows x (finite rows only are meaningful) given the bounded forward."""
    with np.errstate(all="ignore"):  # rows that are not finite compute garbage, dropped after
        return _chunk_finite(fn, x, g, y, sh, den)


def _chunk_finite(fn: Function, x: np.ndarray, g: np.ndarray, y: Bounded, sh: Shift,
                  den: Denominator) -> GradChunk:
    r, n = x.shape
    tau, kept = sh.tau, sh.kept
    finite = (sh.kind == ROW_FINITE)[:, None]
    yh, yl, by = (np.where(kept & finite, a, 0.0) for a in (y.hi, y.lo, y.bound))
    gk = np.where(kept, g, 0.0)
    em_h, em_l, bq_rel, cut = _exp_minus_shift(sh)
    qh, ql = dd.div(em_h, em_l, den.s_h, den.s_l)  # q = exp(-m/tau) / S
    bq = (np.abs(qh) * (bq_rel + den.eps + dd.DIV_DD * dd.U2)
          + np.where(cut, 2.0**-1096, np.where(np.abs(em_h) < TINY, ABS_FLOOR, 0.0)))
    # c = sum g y
    th, tl = dd.mul_d(yh, yl, gk)
    bt = np.abs(gk) * by + np.abs(th) * dd.MUL_D * dd.U2 + floor_of(th, yh, gk)
    c = tree_sum(th, tl, bt)
    # dx = y (g - c) / tau on kept positions
    dh, dl = dd.add_d(-np.broadcast_to(c.h[:, None], (r, n)),
                      -np.broadcast_to(c.lo[:, None], (r, n)), g)
    bd = c.bound[:, None] + np.abs(dh) * dd.ADD_D * dd.U2
    _dominant_difference(x, gk, sh, yh, yl, by, qh, ql, bq, dh, dl, bd)
    ph, pl = dd.mul(yh, yl, dh, dl)
    xh, xl = dd.div_d(ph, pl, tau)
    bx = ((np.abs(yh) * bd + np.abs(dh) * by) / tau
          + np.abs(xh) * (dd.MUL_DD + dd.DIV_D) * dd.U2 + floor_of(xh, yh, dh))
    xh, xl, bx = (np.where(kept, a, 0.0) for a in (xh, xl, bx))
    # parameter gradients, by the role each parameter plays
    dp_h, dp_l, dp_b = (np.zeros((r, len(fn.params))) for _ in range(3))
    for j, p in enumerate(fn.params):
        if p.role == OFFSET:
            bh, bl = dd.mul(c.h, c.lo, qh, ql)
            dp_h[:, j], dp_l[:, j] = -bh, -bl
            dp_b[:, j] = (np.abs(qh) * c.bound + np.abs(c.h) * bq
                          + np.abs(bh) * dd.MUL_DD * dd.U2 + floor_of(bh, c.h, qh))
        elif p.role == TEMPERATURE:
            dp_h[:, j], dp_l[:, j], dp_b[:, j] = _dtau(x, gk, sh, yh, yl, by, th, tl, bt,
                                                       qh, ql, bq)
        else:
            raise ValueError(f"{fn.name}: parameter {p.name} has no gradient rule")
    return GradChunk(xh, xl, SLACK * bx, dp_h, dp_l, SLACK * dp_b)


def _dominant_difference(x, g, sh: Shift, yh, yl, by, qh, ql, bq, dh, dl, bd) -> None:
    """In a row with one largest logit k, g_k - c cancels as y_k nears 1. Since
    1 - y_k = sum_{i != k} y_i + w (w = offset q, the offset's share), it equals
    sum_{i != k} (g_k - g_i) y_i + g_k w, whose terms carry their own small sizes; that form
    replaces g_k - c (in dh, dl, bd) where its bound is smaller."""
    top = sh.kept & (x == sh.m[:, None])
    rows = np.flatnonzero(top.sum(axis=1) == 1)
    if rows.size == 0:
        return
    k = np.argmax(top[rows], axis=1)
    g_top = g[rows, k][:, None]
    ah, al = dd.two_sum(np.broadcast_to(g_top, (rows.size, x.shape[1])), -g[rows])
    uh, ul = dd.mul(ah, al, yh[rows], yl[rows])
    bu = np.abs(ah) * by[rows] + np.abs(uh) * dd.MUL_DD * dd.U2 + floor_of(uh, ah, yh[rows])
    s = tree_sum(uh, ul, bu)
    wh, wl = dd.mul_d(qh[rows], ql[rows], sh.offset)
    vh, vl = dd.mul_d(wh, wl, g_top[:, 0])
    bv = np.abs(g_top[:, 0]) * (sh.offset * bq[rows] + np.abs(wh) * dd.MUL_D * dd.U2) \
        + np.abs(vh) * dd.MUL_D * dd.U2 + floor_of(vh)
    fh, fl = dd.add(s.h, s.lo, vh, vl)
    bf = s.bound + bv + np.abs(fh) * dd.ADD_DD * dd.U2
    better = bf < bd[rows, k]
    rb, kb = rows[better], k[better]
    dh[rb, kb], dl[rb, kb], bd[rb, kb] = fh[better], fl[better], bf[better]


def _exp_minus_shift(sh: Shift) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """exp(-m/tau) per row as a dd, its relative error bound, and whether it was cut to 0
    below dd.EXP_MIN (then it is below 2^-1096)."""
    r = len(sh.m)
    zh, zl = scaled(-sh.m, np.zeros(r), sh.tau)
    eh, el = dd.exp(zh, zl)
    rel = (np.minimum(np.abs(zh), 2048.0) * dd.DIV_D * dd.U2 + dd.EXP_REL
           + subnormal_floor(sh.m) / sh.tau)
    return eh, el, rel, zh < dd.EXP_MIN


def _dtau(x, g, sh: Shift, yh, yl, by, th, tl, bt, qh, ql, bq):
    """Each row's dtau = sum g y (mean - z) / tau, as a dd with its bound, given y, the
    terms t = g y and q = exp(-m/tau)/S (each with its bound)."""
    r, n = x.shape
    tau, kept = sh.tau, sh.kept
    m = np.broadcast_to(sh.m[:, None], (r, n))
    dh, dl = dd.two_sum(np.where(kept, x, m), -m)
    zh, zl = scaled(dh, dl, tau)
    live = kept & (zh >= dd.EXP_MIN)
    zh, zl = np.where(live, zh, 0.0), np.where(live, zl, 0.0)
    bz = np.abs(zh) * dd.DIV_D * dd.U2 + subnormal_floor(dh) / tau
    cut = np.where(kept & ~live, CUT, 0.0)  # |y z| of the terms whose exp is below 2^-1096
    uh, ul = dd.mul(yh, yl, zh, zl)
    bu = (np.abs(zh) * by + np.abs(yh) * bz + np.abs(uh) * dd.MUL_DD * dd.U2
          + floor_of(uh, yh, zh) + cut)
    a = tree_sum(uh, ul, bu)
    # the offset's share w = offset exp(-m/tau) / S, times m/tau
    mt_h, mt_l = scaled(sh.m, np.zeros(r), tau)
    near = np.abs(mt_h) <= 2048.0
    wh, wl = dd.mul_d(qh, ql, sh.offset)
    bw = sh.offset * bq + np.abs(wh) * dd.MUL_D * dd.U2
    b_h, b_l = dd.mul(wh, wl, np.where(near, mt_h, 0.0), np.where(near, mt_l, 0.0))
    # beyond 2^11, w m/tau < offset exp(-m/tau) m/tau is below CUT * offset, and b is 0
    bb = np.where(near, np.abs(wh) * np.abs(mt_h) * dd.DIV_D * dd.U2 + np.abs(mt_h) * bw
                  + np.abs(b_h) * dd.MUL_DD * dd.U2, CUT * max(sh.offset, 1.0))
    mean_h, mean_l = dd.add(a.h, a.lo, -b_h, -b_l)
    bmean = a.bound + bb + np.abs(mean_h) * dd.ADD_DD * dd.U2
    # the terms g y (mean - z)
    fh, fl = dd.add(np.broadcast_to(mean_h[:, None], (r, n)),
                    np.broadcast_to(mean_l[:, None], (r, n)), -zh, -zl)
    bf = bmean[:, None] + bz + np.abs(fh) * dd.ADD_DD * dd.U2
    vh, vl = dd.mul(th, tl, fh, fl)
    bv = (np.abs(th) * bf + np.abs(fh) * bt + np.abs(vh) * dd.MUL_DD * dd.U2
          + floor_of(vh, th, fh))
    vh, vl, bv = (np.where(live, v, 0.0) for v in (vh, vl, bv))
    # a term whose exp was cut: |g y (mean - z)| <= |g| exp(z) (|mean| + |z|) <= |g| CUT (1 + |mean|)
    s = tree_sum(vh, vl, bv + cut * np.abs(g) * (1 + np.abs(mean_h[:, None])))
    oh, ol = dd.div_d(s.h, s.lo, tau)
    return oh, ol, s.bound / tau + np.abs(oh) * dd.DIV_D * dd.U2 + floor_of(oh)


def gradient_truth(fn: Function, params: Mapping[str, float], x64: np.ndarray,
                   g64: np.ndarray, rows: np.ndarray, fmt: FloatFormat
                   ) -> tuple[GradTruth, np.ndarray, bool]:
    """The GradTruth of the given rows, which rows are certified (forward and dx), and
    whether the parameter gradients summed over all rows are (if not, every row must be
    redone by mpmath for them)."""
    x, g = x64[rows], g64[rows]
    out, sh, den = exp_forward(fn, params, x)
    r, n = x.shape
    p = len(fn.params)
    dx_h, dx_l, dx_b = np.zeros((r, n)), np.zeros((r, n)), np.zeros((r, n))
    dp_h, dp_l, dp_b = np.zeros((r, p)), np.zeros((r, p)), np.zeros((r, p))
    ok = certified_rows(out, fmt)
    if den is not None:
        for sl in row_chunks(r, n):
            gc = _chunk(fn, x[sl], g[sl], rows_of(out, sl), rows_of(sh, sl), rows_of(den, sl))
            dx_h[sl], dx_l[sl], dx_b[sl] = gc.dx_h, gc.dx_l, gc.dx_bound
            dp_h[sl], dp_l[sl], dp_b[sl] = gc.dp_h, gc.dp_l, gc.dp_bound
    finite = sh.kind == ROW_FINITE
    nan = sh.kind == ROW_NAN
    dzero = ~sh.kept & ~nan[:, None]
    for a in (dx_h, dx_l, dx_b, dp_h, dp_l, dp_b):
        a[~finite] = 0.0
    dx_h[nan], dx_l[nan], dp_h[nan], dp_l[nan] = np.nan, np.nan, np.nan, np.nan
    ok &= ~finite | certify(dx_h, dx_l, dx_b, fmt).all(axis=1)
    ok &= ~finite | np.isfinite(dp_b).all(axis=1)
    truth = GradTruth(np.asarray(rows, dtype=np.int64), out.hi, out.lo, out.zero, out.zabs,
                      out.zbar, out.kind, dx_h, dx_l, dzero, dp_h, dp_l)
    return truth, ok, params_certified(dp_h, dp_l, dp_b, finite, fmt)


def params_certified(dp_h: np.ndarray, dp_l: np.ndarray, dp_b: np.ndarray,
                     finite: np.ndarray, fmt: FloatFormat) -> bool:
    """Whether every parameter gradient, summed over the rows, is known to CERTIFY_ULP
    units of the working precision (fp64 for fp64, fp32 below) relative to its size."""
    uw, tiny, _ = work_format(fmt)
    for j in range(dp_h.shape[1]):
        h, lo, b = dp_h[finite, j], dp_l[finite, j], dp_b[finite, j]
        total = abs(math.fsum([*h.tolist(), *lo.tolist()]))  # as the checker sums them
        err = math.fsum(b.tolist()) * SLACK
        if not err <= CERTIFY_ULP * uw * max(total - err, tiny):
            return False
    return True
