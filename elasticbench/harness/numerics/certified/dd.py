"""Double-double arithmetic on NumPy arrays, with the relative error bound of each operation.

A double-double (dd) is a pair (hi, lo) of float64 arrays with |lo| <= ulp(hi)/2; it carries
about 106 bits. The operations are the error-free transformations (two_sum, two_prod by
Veltkamp splitting: NumPy has no fused multiply-add) and the accurate double-word algorithms
analysed by Joldes, Muller and Popescu (ACM TOMS 44(2), 2017). Each operation's bound is
stated beside it in units of U2 = 2^-106 (u^2 for u = 2^-53), rounded up from the published
one; docs/numerics.md section 6 adds them up for the reference built on them. Inputs are
assumed finite with products well inside float64's range (|x| < 2^995): callers mask out
what is not.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np

U = 2.0**-53  # unit roundoff of float64
U2 = U * U

# Relative error bounds of the operations below, as multiples of U2 (the published bounds
# plus their O(u^3) terms, rounded up to the next integer).
ADD_DD = 4.0  # accurate sum of two dd (3u^2 + 13u^3)
ADD_D = 3.0  # dd + double (2u^2)
MUL_DD = 8.0  # dd * dd without FMA (7u^2)
MUL_D = 4.0  # dd * double without FMA (3u^2)
DIV_DD = 16.0  # dd / dd (15u^2 + 56u^3)
DIV_D = 4.0  # dd / double (3.5u^2)

_SPLIT = 134217729.0  # 2^27 + 1


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s + e == a + b exactly, s = fl(a + b) (Knuth)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def fast_two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s + e == a + b exactly when |a| >= |b| (or a == 0) (Dekker)."""
    s = a + b
    e = b - (s - a)
    return s, e


def split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a == hi + lo with each half fitting 26 bits (Veltkamp); |a| < 2^995."""
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """p + e == a * b exactly, p = fl(a * b) (Dekker), unless a * b underflows."""
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def add(ah, al, bh, bl) -> tuple[np.ndarray, np.ndarray]:
    """(a + b) as a dd, relative error <= ADD_DD * U2 for any signs."""
    sh, sl = two_sum(ah, bh)
    th, tl = two_sum(al, bl)
    sh, sl = fast_two_sum(sh, sl + th)
    return fast_two_sum(sh, sl + tl)


def add_d(ah, al, b) -> tuple[np.ndarray, np.ndarray]:
    """(a + b) for a dd a and a double b, relative error <= ADD_D * U2."""
    sh, sl = two_sum(ah, b)
    return fast_two_sum(sh, sl + al)


def mul(ah, al, bh, bl) -> tuple[np.ndarray, np.ndarray]:
    """(a * b) as a dd, relative error <= MUL_DD * U2."""
    p, e = two_prod(ah, bh)
    return fast_two_sum(p, e + (ah * bl + al * bh))


def mul_d(ah, al, b) -> tuple[np.ndarray, np.ndarray]:
    """(a * b) for a dd a and a double b, relative error <= MUL_D * U2."""
    p, e = two_prod(ah, b)
    return fast_two_sum(p, e + al * b)


def div(ah, al, bh, bl) -> tuple[np.ndarray, np.ndarray]:
    """(a / b) as a dd, relative error <= DIV_DD * U2."""
    q = ah / bh
    ph, pl = mul_d(bh, bl, q)
    rh, _ = add(ah, al, -ph, -pl)
    return fast_two_sum(q, rh / bh)


def div_d(ah, al, b) -> tuple[np.ndarray, np.ndarray]:
    """(a / b) for a dd a and a double b, relative error <= DIV_D * U2."""
    q = ah / b
    p, e = two_prod(q, b)
    r = ((ah - p) - e) + al
    return fast_two_sum(q, r / b)


# ---------------------------------------------------------------------------------------
# exp(z) for a dd z in [EXP_MIN, 0]: z = N ln2/1024 + r, |r| <= ln2/2048, then
# exp(z) = 2^(N >> 10) * T[N & 1023] * P(r) with T[j] = 2^(j/1024) as a dd table and P the
# Taylor polynomial of degree 7 (truncation below 2^-107). The bound is EXP_REL (relative)
# plus, where the result is below float64's normal range, EXP_ABS (docs/numerics.md 6.2).

EXP_MIN = -760.0  # exp(-760) < 2^-1096: below that the result is 0, off by less than 2^-1096
EXP_REL = 2.0**-97
EXP_ABS = 2.0**-1073  # hi and lo each rounded once to the subnormal grid
_TABLE_BITS = 10
_TABLE = 1 << _TABLE_BITS


def _constants() -> tuple[np.ndarray, np.ndarray, float, float, float, float, float]:
    """The table of 2^(j/1024) as dd, 1024/ln2, ln2/1024 in three parts whose first two have
    31 significant bits (so N * part is exact for |N| < 2^22), and 1/6 as a dd."""
    with mpmath.workprec(240):
        t = [mpmath.mpf(2) ** (mpmath.mpf(j) / _TABLE) for j in range(_TABLE)]
        hi = np.array([float(v) for v in t])
        lo = np.array([float(v - mpmath.mpf(float(v))) for v in t])
        c = mpmath.log(2) / _TABLE

        def top31(v: mpmath.mpf) -> float:
            e = int(mpmath.floor(mpmath.log(abs(v), 2)))
            return float(mpmath.nint(v * mpmath.mpf(2) ** (30 - e)) * mpmath.mpf(2) ** (e - 30))

        c1 = top31(c)
        c2 = top31(c - c1)
        c3 = float(c - c1 - c2)
        inv = float(1 / c)
        sixth = mpmath.mpf(1) / 6
        sixth_hi = float(sixth)
        sixth_lo = float(sixth - sixth_hi)
    return hi, lo, inv, c1, c2, c3, sixth_hi, sixth_lo


_T_HI, _T_LO, _INV_C, _C1, _C2, _C3, _SIXTH_HI, _SIXTH_LO = _constants()


def exp(zh: np.ndarray, zl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """exp(zh + zl) as a dd, for finite z <= 0 (|zl| <= ulp(zh)/2); error <= EXP_REL relative
    plus EXP_ABS absolute (below EXP_MIN the result is exactly 0 and the error below 2^-1096).
    """
    eh, el, k, live = exp_parts(zh, zl)
    # int32 exponents: NumPy's ldexp is several times slower on int64 ones
    return np.where(live, np.ldexp(eh, k), 0.0), np.where(live, np.ldexp(el, k), 0.0)


def exp_parts(zh: np.ndarray, zl: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """exp(z) = (eh + el) * 2^k with eh + el within 2^-10 of [1, 2) (error <= EXP_REL
    relative: nothing has underflowed yet), k int32, where `live` (z >= EXP_MIN): what `exp`
    scales."""
    live = zh >= EXP_MIN
    # every element is evaluated (masking costs more than it saves), the dead ones from
    # EXP_MIN, and set to 0 at the end; NaN stays NaN until then
    zh_l, zl_l = np.maximum(zh, EXP_MIN), np.where(live, zl, 0.0)
    n = np.rint(zh_l * _INV_C)
    # Cody-Waite with three parts: the first subtraction is exact (Sterbenz), the second
    # error-free, the rest is well below 2^-100 absolute.
    t1 = zh_l - n * _C1
    rh, rl = two_sum(t1, -(n * _C2))
    rh, rl = add_d(rh, rl, zl_l)
    rh, rl = add_d(rh, rl, -(n * _C3))
    # P(r) = 1 + r + r^2/2 + r^3/6 + r^4 q(r): the last term in plain double (below 2^-50).
    r2h, r2l = mul(rh, rl, rh, rl)
    r3h, r3l = mul(r2h, r2l, rh, rl)
    r3h, r3l = mul(r3h, r3l, _SIXTH_HI, _SIXTH_LO)
    q = 1 / 24 + rh * (1 / 120 + rh * (1 / 720 + rh * (1 / 5040)))
    sq = rh * rh
    ph, pl = add_d(r3h, r3l, sq * sq * q)
    ph, pl = add(ph, pl, 0.5 * r2h, 0.5 * r2l)
    ph, pl = add(ph, pl, rh, rl)
    ph, pl = add_d(ph, pl, 1.0)
    j = np.nan_to_num(n).astype(np.int32)  # |n| < 2^21 on live elements
    k, idx = j >> _TABLE_BITS, j & (_TABLE - 1)
    eh, el = mul(ph, pl, _T_HI[idx], _T_LO[idx])
    return eh, el, k, live


# ---------------------------------------------------------------------------------------
# Row sums: a pairwise tree over the last axis. Each level is one accurate dd addition, so
# a sum of n terms has at most depth(n) of them between any term and the result.


def depth(n: int) -> int:
    """The number of tree levels that sum_rows uses for rows of n terms."""
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def sum_rows(h: np.ndarray, lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum the dd values (r, n) along the last axis, pairwise: the error of each partial sum
    is at most ADD_DD * U2 times the sum of the absolute values below it, per level."""
    h, lo = np.asarray(h, dtype=np.float64), np.asarray(lo, dtype=np.float64)
    while h.shape[-1] > 1:
        n = h.shape[-1]
        half = n // 2
        sh, sl = add(h[..., :half], lo[..., :half], h[..., half:2 * half], lo[..., half:2 * half])
        if n % 2:
            sh = np.concatenate([sh, h[..., 2 * half:]], axis=-1)
            sl = np.concatenate([sl, lo[..., 2 * half:]], axis=-1)
        h, lo = sh, sl
    if h.shape[-1] == 0:
        return np.zeros(h.shape[:-1]), np.zeros(h.shape[:-1])
    return h[..., 0], lo[..., 0]
