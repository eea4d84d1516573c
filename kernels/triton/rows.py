"""Pieces every row kernel shares: special rows and the rounding of the quotient.

A streamed row's sum is carried across its chunks with a compensation term (`add_compensated`):
each chunk's tree sum has log2(BLOCK) roundings, but adding n/BLOCK chunk sums one after the
other would make n/BLOCK more, which on a long row of similar values (errors that do not
cancel) outgrows the log2(n) the accuracy budget allows (docs/numerics.md section 3).

A row's special values are found from one NaN-propagating maximum (`memory.max_nan`): NaN
anywhere makes it NaN, a +inf (with no NaN) makes it +inf. Ordinary rows take the fast branch;
the rare special rows a branch of their own, so the common path carries no per-element
special-value selects.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def ordinary(top):
    """The row holds neither NaN nor +inf (top: its NaN-propagating maximum)."""
    return (top == top) & (top < float("inf"))


@triton.jit
def special_y(is_inf, n_inf, top):
    """y of a special row: all NaN if it holds a NaN, else 1/k on each of its k infinities."""
    y = tl.where(is_inf, tl.math.div_rn(1.0, n_inf), 0.0)
    return tl.where(top != top, float("nan"), y)


@triton.jit
def reciprocal(den, EXACT: tl.constexpr):
    """1/den for the quotient: exact division is kept for fp32 outputs (see quotient)."""
    r = den if EXACT else tl.math.div_rn(1.0, den)
    return r


@triton.jit
def quotient(w, r, EXACT: tl.constexpr):
    """w / den, r from reciprocal. fp32 outputs divide (0.5 ulp); 16-bit outputs multiply by
    the rounded reciprocal (1 ulp of fp32, far below the 16-bit rounding that follows) and save
    the ~10 instructions of an IEEE division per element."""
    q = tl.math.div_rn(w, r) if EXACT else w * r
    return q


@triton.jit
def add_compensated(total, comp, part):
    """(total + part, new compensation) by Kahan's step: comp carries what earlier additions
    lost; the caller scales both by the same factor when it rescales the sum."""
    y = part - comp
    t = total + y
    return t, (t - total) - y
