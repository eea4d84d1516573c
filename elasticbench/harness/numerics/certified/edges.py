"""Outputs the generic bound cannot place: a row's largest (just below 1/c), those near
float64's bottom, and the rows that are not finite (docs/numerics.md section 6.3)."""

from __future__ import annotations

import numpy as np

from elasticbench.harness.functions.definition import ROW_FINITE, ROW_INF, ROW_MASKED, ROW_NAN
from elasticbench.harness.numerics.certified import dd
from elasticbench.harness.numerics.certified.bounds import (
    ABS_FLOOR,
    SLACK,
    Bounded,
    Denominator,
    Shift,
    arg_rel,
    power_of_two,
    scaled,
)


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
    cut = zabs > -dd.EXP_MIN
    near = (np.abs(eh) < TINY) & ~cut | (np.abs(yh) < TINY) & (yh != 0)
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
