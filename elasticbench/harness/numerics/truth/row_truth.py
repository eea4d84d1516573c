"""Ground truth for a whole input: exact outputs per row, packed into float64 arrays.

Each output y is stored as a double-double hi + lo (hi = y rounded to float64, lo = the
rounded remainder), which is about 106 bits: enough to score fp64 kernels in ulps.
Evaluation runs mpmath at `precision` bits (at least 128).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np

from elasticbench.harness.functions import get_function
from elasticbench.harness.functions.definition import ROW_FINITE

DEFAULT_PRECISION = 128
MIN_PRECISION = 128
# Bump when the meaning of a cached truth changes (a definition or the packing).
TRUTH_VERSION = 4  # 3: zbar exact where |z| overflows a float (was inf); 4: SIDE_BITS
# A row with an output within 2^-(precision - SIDE_MARGIN) of a power of two has its
# outputs evaluated again at SIDE_BITS: which side of the power of two the value lies on
# decides the ulp its error is scored in (a row of subnormal logits has outputs 1/n within
# 10^-320; 128 bits round them to 1/n exactly, the upper binade; docs/numerics.md 6.13).
SIDE_MARGIN = 16
SIDE_BITS = 2048


@dataclass
class Truth:
    """Exact outputs for the rows `rows` of an input of shape (total_rows, n)."""

    rows: np.ndarray  # int64 (r,): which input rows these are
    hi: np.ndarray  # float64 (r, n); NaN where the output must be NaN
    lo: np.ndarray  # float64 (r, n)
    zero: np.ndarray  # bool (r, n): structurally zero outputs
    zabs: np.ndarray  # float64 (r, n): |z_i|
    zbar: np.ndarray  # float64 (r,)
    kind: np.ndarray  # str (r,): finite / nan / inf / masked

    FIELDS = ("rows", "hi", "lo", "zero", "zabs", "zbar", "kind")

    def derived(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """make(), computed once per truth and key: what scoring derives from the truth (ulps,
        allowances) is the same for every kernel judged against it."""
        memo = self.__dict__.setdefault("_derived", {})
        if key not in memo:
            memo[key] = make()
        return memo[key]

    def arrays(self) -> dict[str, np.ndarray]:
        out = {f: getattr(self, f) for f in self.FIELDS}
        out["kind"] = self.kind.astype("U8")
        return out

    @classmethod
    def concat(cls, parts: list[Truth]) -> Truth:
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.FIELDS))


@dataclass
class GradTruth(Truth):
    """A forward truth plus the exact gradients for one upstream gradient g.

    dx is a double-double like y; dp_hi/dp_lo (r, number of parameters) hold each row's
    exact contribution to every parameter's gradient (summed over rows when scored).
    NaN in the hi parts marks a gradient that must be NaN.
    """

    dx_hi: np.ndarray  # float64 (r, n)
    dx_lo: np.ndarray  # float64 (r, n)
    dzero: np.ndarray  # bool (r, n): dx exactly zero by structure
    dp_hi: np.ndarray  # float64 (r, p)
    dp_lo: np.ndarray  # float64 (r, p)

    FIELDS = (*Truth.FIELDS, "dx_hi", "dx_lo", "dzero", "dp_hi", "dp_lo")


def split_double(v, hi: np.ndarray, lo: np.ndarray, idx) -> None:
    """Store the mpf v (None: NaN) as the double-double hi[idx] + lo[idx] (lo 0 when v
    rounds to an infinity). Where hi is a power of two and the rest of v is too small for
    a float64 (below 2^-1075), lo is +-2^-1074 with its sign: which side of hi v lies on
    decides its binade (ulp.binade), and 2^-1074 is nothing beside hi's ulp (hi >= 2^-1000)."""
    if v is None:
        hi[idx] = lo[idx] = np.nan
        return
    h = float(v)
    hi[idx] = h
    if not np.isfinite(h):
        lo[idx] = 0.0
        return
    rest = v - h
    low = float(rest)
    if low == 0 and rest != 0 and abs(h) >= 2.0**-1000 and math.frexp(abs(h))[0] == 0.5:
        low = math.copysign(2.0**-1074, float(mpmath.sign(rest)))
    lo[idx] = low


def _row(fn, params: dict[str, float], x: np.ndarray, g: np.ndarray | None,
         precision: int, sides: bool) -> tuple[Any, Any]:
    """One row's (truth, gradient or None) at `precision`; its outputs again at SIDE_BITS
    (sides) where one lies too close to a power of two for `precision` to tell its side."""
    with mpmath.workprec(precision):
        if g is None:
            t, grad = fn.reference_row(x, **params), None
        else:
            grad = fn.gradient_row(x.tolist(), g.tolist(), **params)
            t = grad.truth
        if not sides or not _sides_unknown(t, precision - SIDE_MARGIN):
            return t, grad
    with mpmath.workprec(max(precision, SIDE_BITS)):
        return fn.reference_row(x, **params), grad


def _sides_unknown(t: Any, bits: int) -> bool:
    """Whether a finite row with two or more distinct nonzero outputs (one alone is 1/count,
    exact where it is a power of two) has one within 2^-bits (relative) of a power of two."""
    live = [v for v in t.group_y if v is not None and v != 0]
    if t.kind != ROW_FINITE or len(live) < 2:
        return False
    near = mpmath.ldexp(1, -bits)
    for v in live:
        m = abs(mpmath.frexp(v)[0])  # in [1/2, 1)
        if m - 0.5 <= near or 1 - m <= near:
            return True
    return False


def evaluate_rows(
    function: str,
    params: dict[str, float],
    x64: np.ndarray,
    rows: np.ndarray,
    precision: int = DEFAULT_PRECISION,
    g64: np.ndarray | None = None,
    sides: bool = True,
) -> Truth:
    """Evaluate the exact definition on the given rows of x64 (float64, exact input values).

    With an upstream gradient g64 (same shape as x64) the result is a GradTruth. sides=False
    skips the SIDE_BITS evaluation of rows with outputs next to a power of two (for a caller
    that compares values and never scores them in ulps: the property tests).
    """
    if precision < MIN_PRECISION:
        raise ValueError(f"precision must be at least {MIN_PRECISION} bits, got {precision}")
    fn = get_function(function)
    if g64 is not None and fn.gradient_row is None:
        raise ValueError(f"{function} has no gradient reference")
    n = x64.shape[1]
    r = len(rows)
    hi = np.zeros((r, n))
    lo = np.zeros((r, n))
    zero = np.zeros((r, n), dtype=bool)
    zabs = np.zeros((r, n))
    zbar = np.zeros(r)
    kind = np.empty(r, dtype="U8")
    p = len(fn.params)
    dx_hi, dx_lo = np.zeros((r, n)), np.zeros((r, n))
    dzero = np.zeros((r, n), dtype=bool)
    dp_hi, dp_lo = np.zeros((r, p)), np.zeros((r, p))
    for k, i in enumerate(rows):
        t, grad = _row(fn, params, x64[i], None if g64 is None else g64[i], precision, sides)
        with mpmath.workprec(precision):
            if grad is not None:
                dzero[k] = grad.zero
                for j, d in enumerate(grad.dx):
                    split_double(d, dx_hi, dx_lo, (k, j))
                for j, name in enumerate(fn.param_names):
                    split_double(grad.dparams[name], dp_hi, dp_lo, (k, j))
            kind[k] = t.kind
            zbar[k] = t.zbar
            # per distinct value, then spread to the elements that have it
            group_hi = np.empty(len(t.group_y))
            group_lo = np.empty(len(t.group_y))
            for j, y in enumerate(t.group_y):
                split_double(y, group_hi, group_lo, j)
            hi[k] = group_hi[t.index]
            lo[k] = group_lo[t.index]
            zero[k] = np.asarray(t.group_zero, dtype=bool)[t.index]
            zabs[k] = np.asarray(t.group_zabs, dtype=np.float64)[t.index]
    idx = np.asarray(rows, dtype=np.int64)
    if g64 is None:
        return Truth(idx, hi, lo, zero, zabs, zbar, kind)
    return GradTruth(idx, hi, lo, zero, zabs, zbar, kind, dx_hi, dx_lo, dzero, dp_hi, dp_lo)
