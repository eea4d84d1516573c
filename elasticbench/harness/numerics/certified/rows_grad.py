"""The fast reference for gradients: dx and the parameter gradients with proven bounds.

For an exp-normalize member with upstream gradient g (docs/gradients.md section 1), in the
shifted form z_i = (x_i - m)/tau, S = sum_kept exp(z_j) + offset exp(-m/tau):

    c = sum_i g_i y_i,   dx_k = y_k (g_k - c) / tau   (0 where x_k is not kept)
    dtau = sum_i g_i y_i (mean - z_i) / tau,   mean = sum_k y_k z_k - w m/tau,  w = offset exp(-m/tau)/S
    doffset = -c exp(-m/tau) / S

each evaluated in double-double (numerics/certified/dd.py) with an absolute error bound carried
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

from elasticbench.harness.functions.definition import (
    OFFSET,
    ROW_FINITE,
    ROW_NAN,
    TEMPERATURE,
    Function,
)
from elasticbench.harness.numerics.certified import dd, native_sweeps
from elasticbench.harness.numerics.certified.bounds import (
    ABS_FLOOR,
    CERTIFY_ULP,
    SLACK,
    Bounded,
    Denominator,
    Shift,
    certify,
    scaled,
    subnormal_floor,
)
from elasticbench.harness.numerics.certified.row_blocks import BLOCK, rows_of
from elasticbench.harness.numerics.certified.rows_forward import certified_rows, exp_forward
from elasticbench.harness.numerics.dtypes import FloatFormat, work_format
from elasticbench.harness.numerics.truth.row_truth import GradTruth

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


def combine(parts: list[RowSums]) -> RowSums:
    """Row sums of a row's column blocks (each a RowSums) as one: a tree over the block sums
    on top of each block's tree, the levels adding up as in tree_sum."""
    if len(parts) == 1:
        return parts[0]
    return tree_sum(*(np.stack([getattr(q, f) for q in parts], axis=1)
                      for f in ("h", "lo", "bound")))


def column_blocks(n: int) -> list[slice]:
    """A row's columns in blocks of row_blocks.BLOCK: a long row is streamed through these,
    so that its temporaries stay a block wide instead of a row wide."""
    return [slice(j, min(n, j + BLOCK)) for j in range(0, n, BLOCK)] or [slice(0, 0)]


@dataclass
class GradChunk:
    """A chunk's parameter gradients per row (its dx goes straight to the caller's arrays)."""

    dp_h: np.ndarray  # (r, p)
    dp_l: np.ndarray
    dp_bound: np.ndarray


@dataclass
class Cols:
    """One column block of a chunk's rows, as every per-element step reads it: the kept
    outputs y with their bounds, g as given and kept, and the terms t = g y of c."""

    x: np.ndarray
    g: np.ndarray
    gk: np.ndarray
    kept: np.ndarray
    yh: np.ndarray
    yl: np.ndarray
    by: np.ndarray
    th: np.ndarray
    tl: np.ndarray
    bt: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray, g: np.ndarray, y: Bounded, sh: Shift, cs: slice) -> Cols:
        kept = sh.kept[:, cs]
        live = kept & (sh.kind == ROW_FINITE)[:, None]
        yh, yl, by = (np.where(live, a[:, cs], 0.0) for a in (y.hi, y.lo, y.bound))
        gk = np.where(kept, g[:, cs], 0.0)
        th, tl = dd.mul_d(yh, yl, gk)
        bt = np.abs(gk) * by + np.abs(th) * dd.MUL_D * dd.U2 + floor_of(th, yh, gk)
        return cls(x[:, cs], g[:, cs], gk, kept, yh, yl, by, th, tl, bt)


@dataclass
class Top:
    """The rows with a single largest kept logit, its column k and g there; once the first
    sweep is done, the cancellation-free form of g_k - c (fh, fl, bound bf)."""

    rows: np.ndarray
    k: np.ndarray
    g: np.ndarray
    fh: np.ndarray | None = None
    fl: np.ndarray | None = None
    bf: np.ndarray | None = None


Out = tuple[np.ndarray, np.ndarray, np.ndarray]  # dx as hi, lo and bound, (r, n) each


def _chunk(fn: Function, x: np.ndarray, g: np.ndarray, y: Bounded, sh: Shift,
           den: Denominator, dx: Out) -> GradChunk:
    """Gradients of the rows x (finite rows only are meaningful) given the bounded forward:
    dx written into dx, the parameter gradients returned."""
    with np.errstate(all="ignore"):  # rows that are not finite compute garbage, dropped after
        return _chunk_finite(fn, x, g, y, sh, den, dx)


def _chunk_finite(fn: Function, x: np.ndarray, g: np.ndarray, y: Bounded, sh: Shift,
                  den: Denominator, dx: Out) -> GradChunk:
    """Two sweeps over the rows' column blocks: the row sums (c, and those of dtau's mean
    and of the dominant difference), then dx and dtau's terms, which need them."""
    r, n = x.shape
    q = _q(sh, den)
    qh, ql, bq = q.h, q.lo, q.bound
    blocks = column_blocks(n)
    roles = {p.role for p in fn.params}
    top = _single_top(x, g, sh)
    c_parts, a_parts, s_parts = [], [], []
    for cs in blocks:
        b = Cols.of(x, g, y, sh, cs)
        c_parts.append(tree_sum(b.th, b.tl, b.bt))  # c = sum g y
        if TEMPERATURE in roles:
            a_parts.append(_mean_terms(b, sh))
        if top is not None:
            s_parts.append(_top_terms(b, top))
    c = combine(c_parts)
    if top is not None:
        _dominant_difference(top, combine(s_parts), q, sh.offset)
    mean = _mean(combine(a_parts), q, sh) if TEMPERATURE in roles else None
    v_parts = []
    for cs in blocks:
        b = Cols.of(x, g, y, sh, cs)
        dx[0][:, cs], dx[1][:, cs], dx[2][:, cs] = _dx(b, c, top, cs, sh.tau)
        if mean is not None:
            v_parts.append(_dtau_terms(b, sh, mean))
    dx[2][...] *= SLACK
    # parameter gradients, by the role each parameter plays
    dp_h, dp_l, dp_b = (np.zeros((r, len(fn.params))) for _ in range(3))
    for j, p in enumerate(fn.params):
        if p.role == OFFSET:
            bh, bl = dd.mul(c.h, c.lo, qh, ql)
            dp_h[:, j], dp_l[:, j] = -bh, -bl
            dp_b[:, j] = (np.abs(qh) * c.bound + np.abs(c.h) * bq
                          + np.abs(bh) * dd.MUL_DD * dd.U2 + floor_of(bh, c.h, qh))
        elif p.role == TEMPERATURE:
            s = combine(v_parts)
            oh, ol = dd.div_d(s.h, s.lo, sh.tau)
            dp_h[:, j], dp_l[:, j] = oh, ol
            dp_b[:, j] = s.bound / sh.tau + np.abs(oh) * dd.DIV_D * dd.U2 + floor_of(oh)
        else:
            raise ValueError(f"{fn.name}: parameter {p.name} has no gradient rule")
    return GradChunk(dp_h, dp_l, SLACK * dp_b)


def _q(sh: Shift, den: Denominator) -> RowSums:
    """q = exp(-m/tau) / S per row, with its bound."""
    em_h, em_l, bq_rel, cut = _exp_minus_shift(sh)
    qh, ql = dd.div(em_h, em_l, den.s_h, den.s_l)
    bq = (np.abs(qh) * (bq_rel + den.eps + dd.DIV_DD * dd.U2)
          + np.where(cut, 2.0**-1096, np.where(np.abs(em_h) < TINY, ABS_FLOOR, 0.0)))
    return RowSums(qh, ql, bq)


def _dx(b: Cols, c: RowSums, top: Top | None, cs: slice, tau: float
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx = y (g - c) / tau on a block's kept positions (0 elsewhere), with its bound; g_k - c
    at a single top k in its cancellation-free form where that is the tighter."""
    r, w = b.x.shape
    dh, dl = dd.add_d(-np.broadcast_to(c.h[:, None], (r, w)),
                      -np.broadcast_to(c.lo[:, None], (r, w)), b.g)
    bd = c.bound[:, None] + np.abs(dh) * dd.ADD_D * dd.U2
    if top is not None:
        here = (top.k >= cs.start) & (top.k < cs.stop)
        rows, k = top.rows[here], top.k[here] - cs.start
        better = top.bf[here] < bd[rows, k]
        rb, kb = rows[better], k[better]
        dh[rb, kb], dl[rb, kb] = top.fh[here][better], top.fl[here][better]
        bd[rb, kb] = top.bf[here][better]
    ph, pl = dd.mul(b.yh, b.yl, dh, dl)
    xh, xl = dd.div_d(ph, pl, tau)
    bx = ((np.abs(b.yh) * bd + np.abs(dh) * b.by) / tau
          + np.abs(xh) * (dd.MUL_DD + dd.DIV_D) * dd.U2 + floor_of(xh, b.yh, dh))
    return tuple(np.where(b.kept, a, 0.0) for a in (xh, xl, bx))  # type: ignore[return-value]


def _single_top(x: np.ndarray, g: np.ndarray, sh: Shift) -> Top | None:
    """The rows whose largest kept logit is there once (see _dominant_difference)."""
    top = sh.kept & (x == sh.m[:, None])
    rows = np.flatnonzero(top.sum(axis=1) == 1)
    if rows.size == 0:
        return None
    k = np.argmax(top[rows], axis=1)
    return Top(rows, k, g[rows, k])


def _top_terms(b: Cols, top: Top) -> RowSums:
    """A block's part of sum_{i != k} (g_k - g_i) y_i, for the single-top rows."""
    rows = top.rows
    ah, al = dd.two_sum(np.broadcast_to(top.g[:, None], (rows.size, b.x.shape[1])),
                        -b.gk[rows])
    uh, ul = dd.mul(ah, al, b.yh[rows], b.yl[rows])
    bu = np.abs(ah) * b.by[rows] + np.abs(uh) * dd.MUL_DD * dd.U2 + floor_of(uh, ah, b.yh[rows])
    return tree_sum(uh, ul, bu)


def _dominant_difference(top: Top, s: RowSums, q: RowSums, offset: float) -> None:
    """In a row with one largest logit k, g_k - c cancels as y_k nears 1. Since
    1 - y_k = sum_{i != k} y_i + w (w = offset q, the offset's share), it equals
    sum_{i != k} (g_k - g_i) y_i + g_k w (s + v), whose terms carry their own small sizes;
    _dx puts that form in place of g_k - c where its bound is smaller."""
    rows, g_top = top.rows, top.g
    wh, wl = dd.mul_d(q.h[rows], q.lo[rows], offset)
    vh, vl = dd.mul_d(wh, wl, g_top)
    bv = np.abs(g_top) * (offset * q.bound[rows] + np.abs(wh) * dd.MUL_D * dd.U2) \
        + np.abs(vh) * dd.MUL_D * dd.U2 + floor_of(vh)
    top.fh, top.fl = dd.add(s.h, s.lo, vh, vl)
    top.bf = s.bound + bv + np.abs(top.fh) * dd.ADD_DD * dd.U2


def _exp_minus_shift(sh: Shift) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """exp(-m/tau) per row as a dd, its relative error bound, and whether it was cut to 0
    below dd.EXP_MIN (then it is below 2^-1096)."""
    r = len(sh.m)
    zh, zl = scaled(-sh.m, np.zeros(r), sh.tau)
    eh, el = dd.exp(zh, zl)
    rel = (np.minimum(np.abs(zh), 2048.0) * dd.DIV_D * dd.U2 + dd.EXP_REL
           + subnormal_floor(sh.m) / sh.tau)
    return eh, el, rel, zh < dd.EXP_MIN


@dataclass
class Z:
    """z = (x - m)/tau on a block's kept positions whose exp is not cut (0 elsewhere), its
    bound, which positions those are, and CUT where a kept position's exp was cut."""

    h: np.ndarray
    lo: np.ndarray
    bound: np.ndarray
    live: np.ndarray
    cut: np.ndarray

    @classmethod
    def of(cls, b: Cols, sh: Shift) -> Z:
        m = np.broadcast_to(sh.m[:, None], b.x.shape)
        dh, dl = dd.two_sum(np.where(b.kept, b.x, m), -m)
        zh, zl = scaled(dh, dl, sh.tau)
        live = b.kept & (zh >= dd.EXP_MIN)
        zh, zl = np.where(live, zh, 0.0), np.where(live, zl, 0.0)
        bz = np.abs(zh) * dd.DIV_D * dd.U2 + subnormal_floor(dh) / sh.tau
        return cls(zh, zl, bz, live, np.where(b.kept & ~live, CUT, 0.0))


def _mean_terms(b: Cols, sh: Shift) -> RowSums:
    """A block's part of sum_k y_k z_k (|y z| of the terms whose exp was cut: below CUT)."""
    z = Z.of(b, sh)
    uh, ul = dd.mul(b.yh, b.yl, z.h, z.lo)
    bu = (np.abs(z.h) * b.by + np.abs(b.yh) * z.bound + np.abs(uh) * dd.MUL_DD * dd.U2
          + floor_of(uh, b.yh, z.h) + z.cut)
    return tree_sum(uh, ul, bu)


def _mean(a: RowSums, q: RowSums, sh: Shift) -> RowSums:
    """mean = sum_k y_k z_k - w m/tau per row, w = offset exp(-m/tau) / S the offset's share."""
    r = len(sh.m)
    mt_h, mt_l = scaled(sh.m, np.zeros(r), sh.tau)
    near = np.abs(mt_h) <= 2048.0
    wh, wl = dd.mul_d(q.h, q.lo, sh.offset)
    bw = sh.offset * q.bound + np.abs(wh) * dd.MUL_D * dd.U2
    b_h, b_l = dd.mul(wh, wl, np.where(near, mt_h, 0.0), np.where(near, mt_l, 0.0))
    # beyond 2^11, w m/tau < offset exp(-m/tau) m/tau is below CUT * offset, and b is 0
    bb = np.where(near, np.abs(wh) * np.abs(mt_h) * dd.DIV_D * dd.U2 + np.abs(mt_h) * bw
                  + np.abs(b_h) * dd.MUL_DD * dd.U2, CUT * max(sh.offset, 1.0))
    mean_h, mean_l = dd.add(a.h, a.lo, -b_h, -b_l)
    return RowSums(mean_h, mean_l, a.bound + bb + np.abs(mean_h) * dd.ADD_DD * dd.U2)


def _dtau_terms(b: Cols, sh: Shift, mean: RowSums) -> RowSums:
    """A block's part of sum g y (mean - z), tau times dtau; a term whose exp was cut is
    bounded by |g y (mean - z)| <= |g| exp(z) (|mean| + |z|) <= |g| CUT (1 + |mean|)."""
    r, w = b.x.shape
    z = Z.of(b, sh)
    fh, fl = dd.add(np.broadcast_to(mean.h[:, None], (r, w)),
                    np.broadcast_to(mean.lo[:, None], (r, w)), -z.h, -z.lo)
    bf = mean.bound[:, None] + z.bound + np.abs(fh) * dd.ADD_DD * dd.U2
    vh, vl = dd.mul(b.th, b.tl, fh, fl)
    bv = (np.abs(b.th) * bf + np.abs(fh) * b.bt + np.abs(vh) * dd.MUL_DD * dd.U2
          + floor_of(vh, b.th, fh))
    vh, vl, bv = (np.where(z.live, v, 0.0) for v in (vh, vl, bv))
    return tree_sum(vh, vl, bv + z.cut * np.abs(b.gk) * (1 + np.abs(mean.h[:, None])))


def gradient_truth(fn: Function, params: Mapping[str, float], x64: np.ndarray,
                   g64: np.ndarray, rows: np.ndarray, fmt: FloatFormat
                   ) -> tuple[GradTruth, np.ndarray, bool]:
    """The GradTruth of the given rows, which rows are certified (forward and dx), and
    whether the parameter gradients summed over all rows are (if not, every row must be
    redone by mpmath for them)."""
    x, g = x64[rows], g64[rows]
    out, sh, den = exp_forward(fn, params, x, tiny=False)
    r, n = x.shape
    p = len(fn.params)
    dx_h, dx_l, dx_b = np.zeros((r, n)), np.zeros((r, n)), np.zeros((r, n))
    dp_h, dp_l, dp_b = np.zeros((r, p)), np.zeros((r, p)), np.zeros((r, p))
    ok = certified_rows(out, fmt)
    if den is not None and (library := native_sweeps.native_sweeps(fn)) is not None:
        q = _q(sh, den)
        native_sweeps.run(library, fn, x, g, out, sh, (q.h, q.lo, q.bound), BLOCK,
                          (dx_h, dx_l, dx_b), (dp_h, dp_l, dp_b))
    elif den is not None:
        for sl in row_chunks(r, n):
            gc = _chunk(fn, x[sl], g[sl], rows_of(out, sl), rows_of(sh, sl), rows_of(den, sl),
                        (dx_h[sl], dx_l[sl], dx_b[sl]))
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
