"""Error of a computed output in ulps of its format, against a double-double reference.

The reference value y is carried as hi + lo (two float64s, about 106 bits), which is
exact enough to score an fp64 kernel to a small fraction of an ulp.
ulp(y) = 2^(max(floor(log2|y|), emin) - p + 1), as in docs/numerics.md section 2.
"""

from __future__ import annotations

import numpy as np

from .dtypes import FloatFormat


def binade(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """floor(log2|hi + lo|) for nonzero values; hi alone can sit one binade too high."""
    mant, exp = np.frexp(hi)  # hi = mant * 2**exp, 0.5 <= |mant| < 1
    e = exp.astype(np.int64) - 1
    # hi a power of two and the tail pointing towards zero: the true value is one binade lower.
    at_power = np.abs(mant) == 0.5
    below = at_power & (lo != 0) & (np.sign(lo) != np.sign(hi))
    return e - below.astype(np.int64)


def ulp_of(hi: np.ndarray, lo: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """ulp of the exact value hi + lo in format fmt (subnormal spacing below the normals)."""
    e = np.where(hi == 0, fmt.emin, binade(np.where(hi == 0, 1.0, hi), lo))
    e = np.maximum(e, fmt.emin)
    return np.ldexp(1.0, (e - fmt.p + 1).astype(np.int64))


def ulp_error(got: np.ndarray, hi: np.ndarray, lo: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """|got - (hi + lo)| / ulp(hi + lo), elementwise, in float64.

    got is the kernel output in any of the formats (converted exactly to float64).
    NaN where either side is NaN; inf where got is infinite and the reference is not.
    """
    g = np.asarray(got).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        # g - hi is exact whenever g is within a factor of two of hi (Sterbenz);
        # otherwise the error is enormous and a relative rounding of it changes nothing.
        diff = np.abs((g - hi) - lo)
        return diff / ulp_of(hi, lo, fmt)  # may overflow to inf: an infinitely bad output
