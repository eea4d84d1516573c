"""Double-doubles with an absolute error bound on every value, and the blocks of the
certified attention phase built from them (scores, weights): shared by the exp family's
phase (numerics/certified/attention_forward.py), the weight-normalize members'
(normalize.py) and the gradients (attention_grad.py); docs/numerics.md
sections 6.5 and 7.5 derive the bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from elasticbench.harness.numerics.certified import dd
from elasticbench.harness.numerics.certified.rows_grad import floor_of


@dataclass
class Bdd:
    """Double-doubles with an absolute error bound each: the exact value lies within
    h + l +- b. The operations below propagate the bound (first-order terms, the product of
    the two bounds, the operation's own relative error, a floor near float64's subnormals)."""

    h: np.ndarray
    l: np.ndarray  # noqa: E741
    b: np.ndarray

    def __neg__(self) -> Bdd:
        return Bdd(-self.h, -self.l, self.b)

    def __getitem__(self, key) -> Bdd:
        return Bdd(self.h[key], self.l[key], self.b[key])

    def where(self, mask: np.ndarray) -> Bdd:
        """The same values where mask holds, exactly 0 elsewhere."""
        return Bdd(np.where(mask, self.h, 0.0), np.where(mask, self.l, 0.0),
                   np.where(mask, self.b, 0.0))

    @classmethod
    def exact(cls, x: np.ndarray) -> Bdd:
        x = np.asarray(x, dtype=np.float64)
        return cls(x, np.zeros_like(x), np.zeros_like(x))


def bmul(x: Bdd, y: Bdd) -> Bdd:
    h, lo = dd.mul(x.h, x.l, y.h, y.l)
    return Bdd(h, lo, np.abs(x.h) * y.b + np.abs(y.h) * x.b + x.b * y.b
               + np.abs(h) * dd.MUL_DD * dd.U2 + floor_of(h, *np.broadcast_arrays(x.h, y.h)))


def bmul_d(x: Bdd, f: np.ndarray | float) -> Bdd:
    """x times exact doubles f (exact, two_prod, where x is a double: x.l = 0)."""
    h, lo = dd.mul_d(x.h, x.l, f)
    return Bdd(h, lo, np.abs(f) * x.b + np.where(x.l != 0, np.abs(h) * dd.MUL_D * dd.U2, 0.0)
               + floor_of(h, *np.broadcast_arrays(x.h, f)))


def bdiv_d(x: Bdd, f: float) -> Bdd:
    h, lo = dd.div_d(x.h, x.l, f)
    return Bdd(h, lo, x.b / abs(f) + np.abs(h) * dd.DIV_D * dd.U2 + floor_of(h, x.h))


def badd(x: Bdd, y: Bdd) -> Bdd:
    h, lo = dd.add(x.h, x.l, y.h, y.l)
    return Bdd(h, lo, x.b + y.b + np.abs(h) * dd.ADD_DD * dd.U2 + floor_of(h))


def bsum(x: Bdd) -> Bdd:
    """Sums over the last axis: a pairwise tree of dd additions, ADD_DD u^2 of the sum of
    the terms' magnitudes per level (dd.sum_rows; none with one nonzero term: adding an
    exact 0 is exact)."""
    h, lo = dd.sum_rows(x.h, x.l)
    levels = dd.depth(x.h.shape[-1])
    tree = np.where((x.h != 0).sum(axis=-1) > 1, levels * dd.ADD_DD * dd.U2, 0.0)  # x + 0: exact
    return Bdd(h, lo, x.b.sum(axis=-1) + tree * np.abs(x.h).sum(axis=-1) + floor_of(h))


def dot(a: np.ndarray, b: np.ndarray) -> Bdd:
    """sum_d a_d b_d over the last axis of broadcast a and b (finite, |.| <= INPUT_MAX):
    error-free products (two_prod; a floor where one lands in the subnormals) summed
    pairwise in double-double."""
    ph, pl = dd.two_prod(a, b)
    return bsum(Bdd(ph, pl, floor_of(ph, *np.broadcast_arrays(a, b))))


@dataclass
class Scores:
    """A block of query rows: the scores over their keys with bounds, and how far the
    certified phase can take each row."""

    s: Bdd  # (r, n) the visible, finite scores (0 elsewhere)
    visible: np.ndarray  # (r, n) bool
    nan_row: np.ndarray  # (r,) bool: a visible score is NaN (from a NaN or inf*0 input)
    trusted: np.ndarray  # (r,) bool: False where mpmath must take the row


@dataclass
class Weights:
    """Each query row's weights with bounds, and what its gradients are built from."""

    y: Bdd  # (r, n) the weights, exactly 0 where not kept
    z: Bdd  # (r, n) (s - m)/tau on kept keys, m the top key's score; 0 elsewhere
    q0: Bdd  # (r,) exp(-m/tau) / S, S the shifted denominator
    share: Bdd  # (r,) the offset's share offset * q0 = 1 - sum y
    mt: Bdd  # (r,) m / tau
    kept: np.ndarray  # (r, n) bool
    top: np.ndarray  # (r,) int: the key the shift m is the score of
    kind: np.ndarray  # (r,) str: finite, masked or nan
    zabs: np.ndarray  # (r, n) |z| rounded to float64 (its bound: z.b, and the rounding)
    zbar: np.ndarray  # (r,) the output-weighted mean of |z|, offset included
    zbar_bound: np.ndarray  # (r,) against the oracle's (which sums its own rounded |z|)
    trusted: np.ndarray  # (r,) bool
    # a weight-normalize member's (numerics/certified/normalize.py; None for the exp family)
    slope: Bdd | None = None  # (r, n) a'(s) on kept keys
    inv: Bdd | None = None  # (r,) 1/D
