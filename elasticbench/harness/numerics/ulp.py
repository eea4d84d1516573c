"""Error of a computed output in ulps of its format, against a double-double reference.

The reference value y is carried as hi + lo (two float64s, about 106 bits), which is
exact enough to score an fp64 kernel to a small fraction of an ulp.
ulp(y) = 2^(max(floor(log2|y|), emin) - p + 1), as in docs/numerics.md section 2.
"""

from __future__ import annotations

import numpy as np

from elasticbench.harness.numerics.dtypes import FloatFormat


def binade(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """floor(log2|hi + lo|) (int32) for nonzero values; hi alone can sit one binade too high."""
    mant, e = np.frexp(hi)  # hi = mant * 2**e, 0.5 <= |mant| < 1; e is int32
    # hi a power of two and the tail pointing towards zero: the true value is one binade lower.
    below = (np.abs(mant) == 0.5) & (lo != 0) & (np.signbit(lo) != np.signbit(hi))
    return e - 1 - below


def ulp_of(hi: np.ndarray, lo: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """ulp of the exact value hi + lo in format fmt (subnormal spacing below the normals)."""
    e = np.maximum(np.where(hi == 0, fmt.emin, binade(hi, lo)), fmt.emin)
    # int32 exponents: NumPy's ldexp is several times slower on int64 ones
    return np.ldexp(1.0, (e - (fmt.p - 1)).astype(np.int32))


def ulp_error(got: np.ndarray, hi: np.ndarray, lo: np.ndarray, fmt: FloatFormat,
              ulp: np.ndarray | None = None) -> np.ndarray:
    """|got - (hi + lo)| / ulp(hi + lo), elementwise, in float64 (ulp: ulp_of(hi, lo, fmt),
    when the caller has it already).

    got is the kernel output in any of the formats (converted exactly to float64).
    NaN where either side is NaN; inf where got is infinite and the reference is not.
    """
    g = np.asarray(got, dtype=np.float64)  # no copy of a float64 array
    with np.errstate(invalid="ignore", over="ignore"):
        # g - hi is exact whenever g is within a factor of two of hi (Sterbenz);
        # otherwise the error is enormous and a relative rounding of it changes nothing.
        # One array, reused by each step (long rows: no temporary of their size per step).
        err = np.subtract(g, hi)
        np.subtract(err, lo, out=err)
        np.abs(err, out=err)
        # may overflow to inf: an infinitely bad output
        return np.divide(err, ulp_of(hi, lo, fmt) if ulp is None else ulp, out=err)
