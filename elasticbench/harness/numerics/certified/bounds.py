"""The pieces of the fast reference's bounds: when an output is certified, what one carries
(Bounded), and the row-wide quantities of an exp-normalize evaluation (its shift, its
denominator) with the error of its exponent arguments (docs/numerics.md section 6)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from elasticbench.harness.functions.definition import (
    ROW_FINITE,
    ROW_INF,
    ROW_MASKED,
    ROW_NAN,
    Function,
)
from elasticbench.harness.numerics.certified import dd
from elasticbench.harness.numerics.dtypes import FloatFormat

CERTIFY_ULP = 2.0**-12  # an output is certified when its bound is below this many ulps
ABS_FLOOR = 2.0**-1071  # absolute slack of outputs rounded near float64's subnormals
PIECE = 1 << 15  # elements certified at once
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
    is certified as float64 stores it (tiny_values).

    Most values pass a cheaper test that implies this one (_clear); the rest take it. Long
    arrays go through in pieces whose temporaries stay in cache."""
    args = [np.broadcast_to(a, np.shape(hi)).reshape(-1) for a in (hi, lo, bound, sided, rounded)]
    ok = np.empty(args[0].size, dtype=bool)
    for i in range(0, ok.size, PIECE):
        part = [a[i:i + PIECE] for a in args]
        clear = _clear(*part[:3], fmt)
        if not clear.all():
            rest = ~clear
            clear[rest] = _certify_each(*(a[rest] for a in part[:3]), fmt,
                                        *(a[rest] for a in part[3:]))
        ok[i:i + PIECE] = clear
    return ok.reshape(np.shape(hi))


def _clear(hi: np.ndarray, lo: np.ndarray, bound: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """A sufficient condition for certify, in under half its operations: the bound is below
    CERTIFY_ULP/2 of fmt's ulps relative to |hi| (ulp(a) > a 2^-p, halved for `sided`), lo
    is a dd's tail, and |hi|'s float64 significand keeps a margin from both powers of two
    that is wider than both (docs/numerics.md section 6.3); exact values, bound 0, too."""
    a = np.abs(hi)
    rel = CERTIFY_ULP * 2.0 ** -(fmt.p + 1)
    margin = int(max(4 * rel, 2.0**-30) * 2**52)  # in units of the significand's last bit
    frac = a.view(np.uint64) & np.uint64((1 << 52) - 1)
    with np.errstate(invalid="ignore", over="ignore"):
        return ((bound <= a * rel) & (np.abs(lo) <= a * 2.0**-40) & (frac >= margin)
                & (frac <= (1 << 52) - margin)) | (bound == 0)


def _certify_each(hi: np.ndarray, lo: np.ndarray, bound: np.ndarray, fmt: FloatFormat,
                  sided: np.ndarray | bool, rounded: np.ndarray | bool) -> np.ndarray:
    """certify's test itself, value by value (vectorized)."""
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
    definition (functions/definition.py exp_normalize) decides them."""
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
