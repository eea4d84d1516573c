"""The fast reference: a function's exact outputs over whole arrays, each with a proven bound.

Every member of the family is evaluated in double-double (numerics/dd.py) over blocks of
the input, carrying a bound on the absolute error of every output. An output is
*certified* when its bound is at most CERTIFY_ULP ulps of the output format and no binade
boundary of that format lies within it, so that its error in ulps, measured against this
value, is exact to CERTIFY_ULP. A row with any output that is not certified goes to the
mpmath oracle (numerics/truth.py), whole, as Ziv's strategy prescribes: a fast phase with
a proof, an accurate phase only where the proof cannot decide (docs/numerics.md section 6).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..functions.base import ROW_FINITE, ROW_INF, ROW_MASKED, ROW_NAN, Function
from . import dd, row_blocks
from .dtypes import FloatFormat
from .row_blocks import blocks, blocks_per_row, sum_depth
from .truth import Truth

CERTIFY_ULP = 2.0**-12  # an output is certified when its bound is below this many ulps
ABS_FLOOR = 2.0**-1071  # absolute slack of outputs rounded near float64's subnormals
SLACK = 1.01  # covers the rounding of the bounds themselves (computed in float64)
# tau outside this range (or a non-finite offset) is left to mpmath: the splits of
# two_prod would overflow or underflow.
TAU_RANGE = (2.0**-400, 2.0**400)


@dataclass
class Bounded:
    """Outputs of some rows with an absolute error bound per output, before certification."""

    hi: np.ndarray  # (r, n)
    lo: np.ndarray
    bound: np.ndarray  # (r, n) absolute error bound of hi + lo; 0 where exact
    zero: np.ndarray  # (r, n) bool: exactly zero by structure
    zabs: np.ndarray  # (r, n)
    zbar: np.ndarray  # (r,)
    kind: np.ndarray  # (r,) str
    trusted: np.ndarray  # (r,) bool: False where the evaluation left its safe domain
    sided: np.ndarray  # (r, n) bool: strictly below hi (a power of two) by structure
    rounded: np.ndarray  # (r, n) bool: hi + lo is y as float64 stores it (tiny_values)


def certify(hi: np.ndarray, lo: np.ndarray, bound: np.ndarray, fmt: FloatFormat,
            sided: np.ndarray | bool = False, rounded: np.ndarray | bool = False
            ) -> np.ndarray:
    """True where hi + lo +- bound is within CERTIFY_ULP ulps of fmt and inside one binade
    (crossing a power of two at or below 2^emin changes no ulp, so it is allowed; an exact
    value, bound 0, is always certified; a `sided` value is known to lie below hi, a power
    of two, so only its size is checked, against the lower binade's ulp); a `rounded` one
    is certified as float64 stores it (tiny_values)."""
    a = np.abs(hi)
    with np.errstate(invalid="ignore", over="ignore"):
        _, e = np.frexp(a)
        binade = np.where(a == 0, fmt.emin, e - 1).astype(np.int32)  # ldexp is slow on int64
        ulp = np.ldexp(1.0, np.maximum(binade, fmt.emin) - fmt.p + 1)
        small = bound <= CERTIFY_ULP * ulp * np.where(sided, 0.5, 1.0)
        low = np.ldexp(1.0, binade)  # the power of two at or below |hi|
        toward = np.where(hi < 0, -lo, lo)  # lo in the direction of |y|
        above_low = ((a - low) + toward >= bound) | (low <= 2.0**fmt.emin) | (a == 0)
        below_high = ((2 * low - a) - toward > bound) | (2 * low <= 2.0**fmt.emin) | (a == 0)
    return ((small & ((above_low & below_high) | sided) & np.isfinite(bound)) | (bound == 0)
            | rounded)


def power_of_two(k: np.ndarray) -> np.ndarray:
    """Whether each positive integer count is a power of two (1/k is then exact)."""
    k = np.asarray(k, dtype=np.int64)
    return (k > 0) & ((k & (k - 1)) == 0)


# ---------------------------------------------------------------------------------------
# exp-normalize: y_i = exp(z_i) / (sum_kept exp(z_j) + offset * exp(-m/tau)), z = (x - m)/tau


@dataclass
class Shift:
    """The row-wide quantities of an exp-normalize evaluation."""

    kind: np.ndarray  # (r,) str
    kept: np.ndarray  # (r, n) bool, kept and in a finite row
    big: np.ndarray  # (r, n) bool, the kept +inf logits (in any row)
    m: np.ndarray  # (r,) the shift (0 outside finite rows)
    tau: float
    offset: float


def exp_shift(fn: Function, params: Mapping[str, float], x: np.ndarray) -> Shift:
    """Which rows are NaN, infinite, masked or finite, and the shift m of each, as the
    definition (functions/base.py exp_normalize) decides them."""
    with np.errstate(invalid="ignore"):
        kept = np.asarray(fn.kept(x), dtype=bool)
    nan_row = np.isnan(x).any(axis=1)
    big = kept & (x == np.inf)
    inf_row = big.any(axis=1) & ~nan_row
    m = np.maximum(np.where(kept, x, -np.inf).max(axis=1, initial=-np.inf), fn.shift_floor)
    kind = np.where(nan_row, ROW_NAN, np.where(inf_row, ROW_INF, np.where(
        m == -np.inf, ROW_MASKED, ROW_FINITE))).astype("U8")
    finite = kind == ROW_FINITE
    return Shift(kind, kept & finite[:, None], big, np.where(finite, m, 0.0),
                 fn.temperature(params), fn.offset(params))


def scaled(dh: np.ndarray, dl: np.ndarray, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """z = d / tau as a dd where |z| <= 2^11; beyond, z is d/tau rounded (its exp is 0)."""
    with np.errstate(over="ignore", invalid="ignore"):
        q = dh / tau
        near = np.abs(q) <= 2048.0
    zh, zl = q.copy(), np.zeros_like(q)
    if near.any():
        zh[near], zl[near] = dd.div_d(dh[near], dl[near], tau)
    return zh, zl


def arg_rel(zabs: np.ndarray, tau: float) -> np.ndarray:
    """Relative error bound of exp(z) for z computed as (x - m)/tau by `scaled`: the
    division's error times |z|, the exp's own, and where x - m is so small that two_prod
    is not exact (below 2^-960), up to 2^-1070 absolute in z, over tau."""
    return (np.minimum(zabs, 2048.0) * dd.DIV_D * dd.U2 + dd.EXP_REL
            + subnormal_floor(zabs * tau) / tau)


def subnormal_floor(d: np.ndarray) -> np.ndarray:
    """2^-1070 where a nonzero difference is below 2^-960 (its division loses exactness)."""
    return np.where((d != 0) & (np.abs(d) < 2.0**-960), 2.0**-1070, 0.0)


def offset_term(shift: Shift) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """offset * exp(-m/tau) per row as a dd, and |m/tau| (its |z|)."""
    r = len(shift.m)
    if not shift.offset:
        return np.zeros(r), np.zeros(r), np.zeros(r)
    zh, zl = scaled(-shift.m, np.zeros(r), shift.tau)
    eh, el = dd.exp(zh, zl)
    ch, cl = dd.mul_d(eh, el, shift.offset)
    return ch, cl, np.abs(zh)


@dataclass
class Denominator:
    """Each row's denominator S = sum_kept exp(z) + offset * exp(-m/tau) as a dd, its
    relative error bound, and the offset term as a dd."""

    s_h: np.ndarray
    s_l: np.ndarray
    eps: np.ndarray
    offset_h: np.ndarray
    offset_l: np.ndarray


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
    ch, cl, cz = offset_term(sh)
    total = n if counts is None else counts.sum(axis=1)  # terms of each row's sum
    tiny_diff = (subnormal_floor(zabs * tau) > 0).any(axis=1)
    sh_, sl_ = dd.sum_rows(part_h, part_l)
    s_h, s_l = dd.add(sh_, sl_, ch, cl)
    finite = sh.kind == ROW_FINITE
    with np.errstate(invalid="ignore", divide="ignore"):
        zbar = np.where(finite, (part_z.sum(axis=1) + np.where(ch != 0, ch * cz, 0.0)) / s_h,
                        0.0)
        # the denominator: its terms' own errors (weighted: zbar), the tree, underflows
        eps_s = (zbar * dd.DIV_D * dd.U2 + dd.EXP_REL + 2.0**-1070 / tau * tiny_diff
                 + sum_depth(int(np.max(total, initial=n)) + 1) * dd.ADD_DD * dd.U2
                 + dd.MUL_D * dd.U2
                 + (total + 1 + sh.offset) * dd.EXP_ABS / np.where(finite, s_h, 1.0))
        if counts is not None:  # a value's term times its count: one more rounding each
            eps_s = eps_s + dd.MUL_D * dd.U2 + n * ABS_FLOOR / np.where(finite, s_h, 1.0)
    den = Denominator(s_h, s_l, eps_s, ch, cl)
    bound = divide(hi, lo, zabs, sh, den)
    zero = ~sh.kept & finite[:, None]
    special_rows(sh.kind, sh.big, hi, lo, bound, zero, counts)
    out = Bounded(hi, lo, bound, zero, zabs, zbar, sh.kind, trusted,
                  np.zeros((r, n), dtype=bool), np.zeros((r, n), dtype=bool))
    top_values(top, sh.kept, rest.sum(axis=1) + ch, s_h, sh.offset, out, counts)
    if tiny:
        tiny_values(x, sh, den, out)
    return out, sh, den


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


def top_values(top: np.ndarray, kept: np.ndarray, rest: np.ndarray, s_h: np.ndarray,
               offset: float, out: Bounded, counts: np.ndarray | None = None) -> None:
    """Where a row's c largest logits are equal and c is a power of two (one dominant logit,
    ties), their output 1/S lies just below the power of two 1/c, often closer to it than
    the division's bound can tell. It is written as 1/c - gap, gap = rest/(c S) with rest
    the float64 sum of the other terms (known to (others + 6) u relative, plus what
    underflowed); and it is below 1/c exactly when there is another term at all, so its
    binade is known by structure (out.sided), however small the gap. counts: as in
    exp_forward."""
    w = 1.0 if counts is None else counts
    c = (top * w).sum(axis=1)
    power = power_of_two(c)
    if not power.any():
        return
    others = (kept * w).sum(axis=1) - c
    below = (others > 0) | (offset > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        cs = c * s_h
        gap = np.where(below, np.maximum(rest / cs, 2.0**-1074), 0.0)
        err = np.where(below, SLACK * (gap * (others + 6) * dd.U
                                       + (others + offset + 1) * 2.0**-1072 / cs), 0.0)
    gap_h, gap_l = dd.two_sum(1.0 / np.maximum(c, 1), -gap)
    near = power & (gap + err < 0.25 / np.maximum(c, 1))
    use = top & near[:, None] & (err[:, None] < out.bound)
    rows = np.nonzero(use)[0]
    out.hi[use], out.lo[use], out.bound[use] = gap_h[rows], gap_l[rows], err[rows]
    out.sided |= use


TINY = 2.0**-960  # below this a dd's lo part is subnormal (tiny_slack's floor)


def tiny_values(x: np.ndarray, sh: Shift, den: Denominator, out: Bounded) -> None:
    """The outputs below 2^-960, whose bounds carry tiny_slack's absolute floor, evaluated
    again with the exponential's power of two kept apart (exp_parts), so that the quotient
    keeps its 106 bits, then rounded to float64's grid: hi = y rounded to nearest, lo = the
    rest rounded (0 below 2^-1021). Where no value within the bound rounds differently,
    hi + lo is y to half of float64's spacing (2^-1075), as mpmath's value stored by
    truth.split_double sums to, which no float64 pair betters; the output is marked
    `rounded` (docs/numerics.md section 6.3)."""
    cand = (sh.kept & (np.abs(out.hi) < TINY) & ~out.sided & (out.bound > 0)
            & (sh.kind == ROW_FINITE)[:, None] & (den.s_h * (1 - den.eps) >= 0.5)[:, None])
    if not cand.any():
        return
    rows, cols = np.nonzero(cand)
    zh, zl = scaled(*dd.two_sum(x[rows, cols], -sh.m[rows]), sh.tau)
    eh, el, k, live = dd.exp_parts(zh, zl)
    # below EXP_MIN, y < 2^-1096 / S <= 2^-1095 (S >= 1/2): 0 when rounded
    yh, yl = dd.div(eh, el, den.s_h[rows], den.s_l[rows])
    rel = arg_rel(np.abs(zh), sh.tau) + den.eps[rows] + dd.DIV_DD * dd.U2
    b = SLACK * np.abs(yh) * rel  # in units of 2^k
    step = np.ldexp(1.0, np.clip(-1074 - k, -1000, 1000).astype(np.int32))  # 2^-1074 / 2^k
    low = np.ldexp(np.abs(yh), k) < 2.0**-1021  # hi itself on the grid; else lo rounds
    part = np.where(low, yh, yl)  # the part rounded to the grid, in units of 2^k
    near = np.rint(part / step) * step  # nearest to part alone: lo may move it one step
    off = (part - near) + np.where(low, yl, 0.0)
    move = np.where(off > 0.5 * step, step, np.where(off < -0.5 * step, -step, 0.0))
    near, miss = near + move, np.abs(off - move)  # miss: how far y is from its grid point
    tie_free = low | (np.abs(yl) + b < 0.5 * np.abs(np.spacing(yh)))  # hi = RN(y) above
    ok = ~live | ((miss * (1 + 2.0**-50) + b < 0.5 * step) & tie_free)  # miss: one rounding
    hi = np.where(live, np.where(low, np.ldexp(near, k), np.ldexp(yh, k)), 0.0)
    lo = np.where(live & ~low, np.ldexp(near, k), 0.0)
    r, c = rows[ok], cols[ok]
    out.hi[r, c], out.lo[r, c], out.rounded[r, c] = hi[ok], lo[ok], True
    out.bound[r, c] = 2.0**-1075  # half of float64's spacing there: how far y can be


def tiny_slack(eh: np.ndarray, yh: np.ndarray, zabs: np.ndarray) -> np.ndarray:
    """Absolute error of y = e / S (S >= 1) from float64's bottom: an exp rounded to the
    subnormal grid (to 0, too), or cut to 0 below EXP_MIN (2^-1096 at most); y rounded
    there."""
    tiny = 2.0**-960  # below this, the lo part of a dd is subnormal
    cut = zabs > -dd.EXP_MIN
    near = (np.abs(eh) < tiny) & ~cut | (np.abs(yh) < tiny) & (yh != 0)
    return np.where(near, ABS_FLOOR, 0.0) + np.where(cut, 2.0**-1096, 0.0)


def special_rows(kind: np.ndarray, big: np.ndarray, hi: np.ndarray, lo: np.ndarray,
                 bound: np.ndarray, zero: np.ndarray, counts: np.ndarray | None = None
                 ) -> None:
    """Fill the rows that are not finite, as the policy has them (docs/definitions.md
    section 3): NaN rows all NaN; rows with infinite weights (big) 1/k on the k of them and
    exactly 0 elsewhere; masked rows exactly 0."""
    nan, inf, masked = kind == ROW_NAN, kind == ROW_INF, kind == ROW_MASKED
    hi[nan], lo[nan], bound[nan], zero[nan] = np.nan, np.nan, 0.0, False
    hi[masked], lo[masked], bound[masked], zero[masked] = 0.0, 0.0, 0.0, True
    if inf.any():
        b = big[inf]
        k = (b * (1.0 if counts is None else counts[inf])).sum(axis=1, keepdims=True)
        sh, sl = dd.div_d(np.ones_like(k), np.zeros_like(k), k)
        hi[inf] = np.where(b, sh, 0.0)
        lo[inf] = np.where(b, sl, 0.0)
        bound[inf] = np.where(b & ~power_of_two(k), SLACK * dd.DIV_D * dd.U2 * sh, 0.0)
        zero[inf] = ~b


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
    if finite.any():
        good = certify(out.hi[finite], out.lo[finite], out.bound[finite], fmt,
                       out.sided[finite], out.rounded[finite])
        ok[finite] &= good.all(axis=1)
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
