"""The fast reference: a function's exact outputs over whole arrays, each with a proven bound.

Every member of the family is evaluated in double-double (numerics/certified/dd.py) over blocks of
the input, carrying a bound on the absolute error of every output. An output is
*certified* when its bound is at most CERTIFY_ULP ulps of the output format and no binade
boundary of that format lies within it, so that its error in ulps, measured against this
value, is exact to CERTIFY_ULP. A row with any output that is not certified goes to the
mpmath oracle (numerics/truth/row_truth.py), whole, as Ziv's strategy prescribes: a fast phase with
a proof, an accurate phase only where the proof cannot decide (docs/numerics.md section 6).
"""

import math
from collections.abc import Mapping

import numpy as np

from elasticbench.harness.functions.definition import (
    ROW_FINITE,
    ROW_INF,
    ROW_MASKED,
    ROW_NAN,
    Function,
)
from elasticbench.harness.numerics.certified import dd, row_blocks
from elasticbench.harness.numerics.certified.bounds import (
    ABS_FLOOR,
    SLACK,
    TAU_RANGE,
    Bounded,
    Denominator,
    Shift,
    arg_rel,
    certify,
    exp_shift,
    offset_term,
    scaled,
    subnormal_floor,
)
from elasticbench.harness.numerics.certified.edges import (
    special_rows,
    tiny_slack,
    tiny_values,
    top_values,
)
from elasticbench.harness.numerics.certified.row_blocks import blocks, blocks_per_row, sum_depth
from elasticbench.harness.numerics.dtypes import FloatFormat
from elasticbench.harness.numerics.truth.row_truth import Truth


def exp_forward(fn: Function, params: Mapping[str, float], x: np.ndarray,
                counts: np.ndarray | None = None, tiny: bool = True
                ) -> tuple[Bounded, Shift, Denominator | None]:
    """Outputs of an exp-normalize member on the rows x (float64) with bounds, the shift and
    the denominator (None: every row to mpmath); counts: of each value in its row (row_blocks);
    tiny: outputs below 2^-960 rounded as float64 stores them (tiny_values; the backward,
    which multiplies them on, keeps them unrounded)."""
    if counts is None and (whole := row_blocks.by_distinct(
            lambda v, c: exp_forward(fn, params, v, c, tiny), x)) is not None:
        return whole
    r, n = x.shape
    sh = exp_shift(fn, params, x)
    tau = sh.tau
    trusted = np.full(r, TAU_RANGE[0] <= tau <= TAU_RANGE[1] and math.isfinite(sh.offset)
                      and sh.offset < 2.0**900)
    if not trusted.all():
        return _untrusted(x, sh.kind), sh, None
    hi, lo, zabs = np.zeros((r, n)), np.zeros((r, n)), np.zeros((r, n))
    nb = blocks_per_row(n)
    part_h, part_l, part_z = np.zeros((r, nb)), np.zeros((r, nb)), np.zeros((r, nb))
    top = sh.kept & (x == sh.m[:, None])  # the terms exp(0) = 1, exactly
    rest = np.zeros((r, nb))  # the other terms, summed in plain float64
    for rows, cols, b in blocks((r, n)):
        keep = sh.kept[rows, cols]
        if not keep.any():
            continue
        xs = x[rows, cols][keep]
        ms = np.broadcast_to(sh.m[rows, None], keep.shape)[keep]
        dh, dl = dd.two_sum(xs, -ms)
        zh, zl = scaled(dh, dl, tau)
        eh, el = dd.exp(zh, zl)
        blk_h, blk_l, blk_z = (np.zeros(keep.shape) for _ in range(3))
        blk_h[keep], blk_l[keep], blk_z[keep] = eh, el, np.abs(zh)
        hi[rows, cols], lo[rows, cols], zabs[rows, cols] = blk_h, blk_l, blk_z
        th, tl = (blk_h, blk_l) if counts is None else dd.mul_d(blk_h, blk_l, counts[rows, cols])
        part_h[rows, b], part_l[rows, b] = dd.sum_rows(th, tl)
        # a term that is 0 weighs nothing, also where its |z| overflowed to inf (huge logits)
        part_z[rows, b] = np.multiply(th, blk_z, out=np.zeros_like(th), where=th != 0).sum(axis=1)
        rest[rows, b] = np.where(top[rows, cols], 0.0, th).sum(axis=1)
    den, zbar = _denominator(sh, part_h, part_l, part_z, zabs, counts)
    bound = divide(hi, lo, zabs, sh, den)
    zero = ~sh.kept & (sh.kind == ROW_FINITE)[:, None]
    special_rows(sh.kind, sh.big, hi, lo, bound, zero, counts)
    out = Bounded(hi, lo, bound, zero, zabs, zbar, sh.kind, trusted,
                  np.zeros((r, n), dtype=bool), np.zeros((r, n), dtype=bool))
    top_values(top, sh.kept, rest.sum(axis=1) + den.offset_h, den.s_h, sh.offset, out, counts)
    if tiny:
        tiny_values(x, sh, den, out)
    return out, sh, den


def _denominator(sh: Shift, part_h: np.ndarray, part_l: np.ndarray, part_z: np.ndarray,
                 zabs: np.ndarray, counts: np.ndarray | None) -> tuple[Denominator, np.ndarray]:
    """Each row's S from its block sums (dd) and the offset term, with its relative bound, and
    zbar (the block sums of e|z|, part_z, over S)."""
    n = zabs.shape[1]
    ch, cl, cz = offset_term(sh)
    total = n if counts is None else counts.sum(axis=1)  # terms of each row's sum
    tiny_diff = (subnormal_floor(zabs * sh.tau) > 0).any(axis=1)
    sh_, sl_ = dd.sum_rows(part_h, part_l)
    s_h, s_l = dd.add(sh_, sl_, ch, cl)
    finite = sh.kind == ROW_FINITE
    with np.errstate(invalid="ignore", divide="ignore"):
        zbar = np.where(finite, (part_z.sum(axis=1) + np.where(ch != 0, ch * cz, 0.0)) / s_h,
                        0.0)
        # its terms' own errors (weighted: zbar), the tree, underflows
        eps_s = (zbar * dd.DIV_D * dd.U2 + dd.EXP_REL + 2.0**-1070 / sh.tau * tiny_diff
                 + sum_depth(int(np.max(total, initial=n)) + 1) * dd.ADD_DD * dd.U2
                 + dd.MUL_D * dd.U2
                 + (total + 1 + sh.offset) * dd.EXP_ABS / np.where(finite, s_h, 1.0))
        if counts is not None:  # a value's term times its count: one more rounding each
            eps_s = eps_s + dd.MUL_D * dd.U2 + n * ABS_FLOOR / np.where(finite, s_h, 1.0)
    return Denominator(s_h, s_l, eps_s, ch, cl), zbar


def divide(hi: np.ndarray, lo: np.ndarray, zabs: np.ndarray, sh: Shift,
           den: Denominator) -> np.ndarray:
    """y = e / S in place of the exponentials e = hi + lo (kept positions; 0 elsewhere), block
    by block, and each output's absolute error bound (returned)."""
    bound = np.zeros(hi.shape)
    for rows, cols, _ in blocks(hi.shape):
        keep = sh.kept[rows, cols]
        if not keep.any():
            continue
        sb_h = np.broadcast_to(den.s_h[rows, None], keep.shape)
        sb_l = np.broadcast_to(den.s_l[rows, None], keep.shape)
        yh, yl = dd.div(hi[rows, cols], lo[rows, cols], sb_h, sb_l)
        rel = (arg_rel(zabs[rows, cols], sh.tau) + den.eps[rows, None] + dd.DIV_DD * dd.U2)
        blk = SLACK * (np.abs(yh) * rel + tiny_slack(hi[rows, cols], yh, zabs[rows, cols]))
        hi[rows, cols] = np.where(keep, yh, 0.0)
        lo[rows, cols] = np.where(keep, yl, 0.0)
        bound[rows, cols] = np.where(keep, blk, 0.0)
    return bound


def _untrusted(x: np.ndarray, kind: np.ndarray) -> Bounded:
    """Nothing evaluated: every row left to mpmath."""
    r, n = x.shape
    z = np.zeros((r, n))
    no = np.zeros((r, n), dtype=bool)
    return Bounded(z, z.copy(), z.copy(), no, z.copy(), np.zeros(r), kind,
                   np.zeros(r, dtype=bool), no.copy(), no.copy())


# ---------------------------------------------------------------------------------------
# weight-normalize: y_i = w(x_i) / (constant + sum_j w(x_j)), w >= 0 (stablemax, symax)


def weight_forward(fn: Function, params: Mapping[str, float], x: np.ndarray,
                   counts: np.ndarray | None = None) -> Bounded:
    """Outputs of a weight-normalize member on the rows x (float64), with bounds."""
    assert fn.weights is not None
    if counts is None and (whole := row_blocks.by_distinct(
            lambda v, c: weight_forward(fn, params, v, c), x)) is not None:
        return whole
    r, n = x.shape
    constant = fn.weight_offset(params)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        wh, wl, wrel = fn.weights(x)
    nan_row = np.isnan(x).any(axis=1)
    big = np.isinf(wh)
    inf_row = big.any(axis=1) & ~nan_row
    wh = np.where(big | np.isnan(wh), 0.0, wh)
    wl = np.where(np.isfinite(wl), wl, 0.0)
    nb = blocks_per_row(n)
    part_h, part_l = np.zeros((r, nb)), np.zeros((r, nb))
    th, tl = (wh, wl) if counts is None else dd.mul_d(wh, wl, counts)
    for rows, cols, b in blocks((r, n)):
        part_h[rows, b], part_l[rows, b] = dd.sum_rows(th[rows, cols], tl[rows, cols])
    s_h, s_l = dd.sum_rows(part_h, part_l)
    s_h, s_l = dd.add_d(s_h, s_l, constant)
    kind = np.where(nan_row, ROW_NAN, np.where(inf_row, ROW_INF, np.where(
        s_h == 0, ROW_MASKED, ROW_FINITE))).astype("U8")
    finite = kind == ROW_FINITE
    trusted = np.isfinite(s_h) | ~finite  # a sum that overflows float64 goes to mpmath
    safe_s = np.where(finite & trusted, s_h, 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        worst = np.where(wh > 0, wrel, 0.0).max(axis=1, initial=0.0)
        total = n if counts is None else counts.sum(axis=1)  # terms of each row's sum
        eps_s = (worst + sum_depth(int(np.max(total, initial=n)) + 1) * dd.ADD_DD * dd.U2
                 + dd.ADD_D * dd.U2 + total * ABS_FLOOR / safe_s)
        if counts is not None:  # a value's term times its count: one more rounding each
            eps_s = eps_s + dd.MUL_D * dd.U2 + n * ABS_FLOOR / safe_s
        sb_l = np.where(finite & trusted, s_l, 0.0)
        yh, yl = dd.div(wh, wl, np.broadcast_to(safe_s[:, None], wh.shape),
                        np.broadcast_to(sb_l[:, None], wh.shape))
        bound = SLACK * (np.abs(yh) * (wrel + eps_s[:, None] + dd.DIV_DD * dd.U2)
                         + np.where((wh != 0) & (np.abs(yh) < 2.0**-960), ABS_FLOOR, 0.0))
    hi, lo = np.where(finite[:, None], yh, 0.0), np.where(finite[:, None], yl, 0.0)
    bound = np.where(finite[:, None], bound, 0.0)
    zero = (wh == 0) & finite[:, None]  # no weight underflows: only an exact 0 is 0
    special_rows(kind, big, hi, lo, bound, zero, counts)
    no = np.zeros((r, n), dtype=bool)
    return Bounded(hi, lo, bound, zero, np.zeros((r, n)), np.zeros(r), kind, trusted, no,
                   no.copy())


def forward(fn: Function, params: Mapping[str, float], x: np.ndarray,
            counts: np.ndarray | None = None) -> Bounded:
    """The bounded outputs of fn on the rows x (float64, exact copies of the inputs)."""
    if fn.weights is not None:
        return weight_forward(fn, params, x, counts)
    return exp_forward(fn, params, x, counts)[0]


def certified_rows(out: Bounded, fmt: FloatFormat) -> np.ndarray:
    """(r,) True for the rows whose every output is certified in fmt."""
    ok = out.trusted.copy()
    finite = (out.kind == ROW_FINITE) | (out.kind == ROW_INF)
    if finite.any():  # every row certified as it is (no copies); only finite ones count
        good = certify(out.hi, out.lo, out.bound, fmt, out.sided, out.rounded).all(axis=1)
        ok &= ~finite | good
    return ok


def forward_truth(fn: Function, params: Mapping[str, float], x64: np.ndarray,
                  rows: np.ndarray, fmt: FloatFormat) -> tuple[Truth, np.ndarray]:
    """The Truth of the given rows of x64 and, per row, whether it is certified (the others
    hold no values yet: the caller asks mpmath for them). A row that repeats its values is
    evaluated and certified per distinct value (row_blocks.py), then spread over its row."""
    def truth(x: np.ndarray, counts: np.ndarray | None) -> tuple[Truth, np.ndarray]:
        out = forward(fn, params, x, counts)
        return (Truth(np.zeros(len(x), dtype=np.int64), out.hi, out.lo, out.zero, out.zabs,
                      out.zbar, out.kind), certified_rows(out, fmt))

    x = x64[rows]
    whole = row_blocks.by_distinct(truth, x)
    result, ok = whole if whole is not None else truth(x, None)
    result.rows = np.asarray(rows, dtype=np.int64)
    return result, ok
