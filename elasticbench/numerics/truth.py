"""Ground truth for a whole input: exact outputs per row, packed into float64 arrays.

Each output y is stored as a double-double hi + lo (hi = y rounded to float64, lo = the
rounded remainder), which is about 106 bits: enough to score fp64 kernels in ulps.
Evaluation runs mpmath at `precision` bits (at least 128).
"""

from __future__ import annotations

from dataclasses import dataclass

import mpmath
import numpy as np

from ..functions import get_function

DEFAULT_PRECISION = 128
MIN_PRECISION = 128
# Bump when the meaning of a cached truth changes (a definition or the packing).
TRUTH_VERSION = 2


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

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "rows": self.rows,
            "hi": self.hi,
            "lo": self.lo,
            "zero": self.zero,
            "zabs": self.zabs,
            "zbar": self.zbar,
            "kind": self.kind.astype("U8"),
        }

    @classmethod
    def concat(cls, parts: list[Truth]) -> Truth:
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


_FIELDS = ("rows", "hi", "lo", "zero", "zabs", "zbar", "kind")


def evaluate_rows(
    function: str,
    params: dict[str, float],
    x64: np.ndarray,
    rows: np.ndarray,
    precision: int = DEFAULT_PRECISION,
) -> Truth:
    """Evaluate the exact definition on the given rows of x64 (float64, exact input values)."""
    if precision < MIN_PRECISION:
        raise ValueError(f"precision must be at least {MIN_PRECISION} bits, got {precision}")
    fn = get_function(function)
    n = x64.shape[1]
    r = len(rows)
    hi = np.zeros((r, n))
    lo = np.zeros((r, n))
    zero = np.zeros((r, n), dtype=bool)
    zabs = np.zeros((r, n))
    zbar = np.zeros(r)
    kind = np.empty(r, dtype="U8")
    with mpmath.workprec(precision):
        for k, i in enumerate(rows):
            t = fn.reference_row(x64[i].tolist(), **params)
            kind[k] = t.kind
            zero[k] = t.zero
            zabs[k] = t.zabs
            zbar[k] = t.zbar
            if t.kind == "nan":
                hi[k] = np.nan
                lo[k] = np.nan
                continue
            for j, y in enumerate(t.y):
                h = float(y)
                hi[k, j] = h
                lo[k, j] = float(y - h)
    return Truth(np.asarray(rows, dtype=np.int64), hi, lo, zero, zabs, zbar, kind)
