"""Powers of two and binades of float64 arrays, read from and built from their bits.

np.frexp and np.ldexp are several times slower than the bit operations for normal numbers;
these give exactly what they give, and fall back to them for the rest (zero, subnormal,
inf, NaN). The certified reference checks millions of outputs' binades per run.
"""

from __future__ import annotations

import numpy as np

_MANTISSA_BITS = 52
_BIAS = 1023


def exponent(a: np.ndarray) -> np.ndarray:
    """floor(log2 a) for a >= 0 as int32, as np.frexp's exponent minus 1 gives it (-1 for
    0, inf and NaN). Read from the bits for normal numbers (frexp is several times slower),
    by frexp for the rest."""
    field = (np.asarray(a, dtype=np.float64).view(np.int64) >> _MANTISSA_BITS) & 0x7FF
    e = (field - _BIAS).astype(np.int32)
    odd = (field == 0) | (field == 0x7FF)  # zero, subnormal, inf, NaN
    if odd.any():
        e[odd] = np.frexp(a[odd])[1] - 1
    return e


def power_of_two_at(k: np.ndarray) -> np.ndarray:
    """2.0**k for int32 k, exactly as np.ldexp(1.0, k): built from the bits where 2^k is a
    normal float64, by ldexp elsewhere (subnormal, 0, inf)."""
    k = np.asarray(k, dtype=np.int32)
    normal = (k >= 1 - _BIAS) & (k <= _BIAS)
    out = ((np.where(normal, k, 0).astype(np.int64) + _BIAS) << _MANTISSA_BITS).view(np.float64)
    if not normal.all():
        out[~normal] = np.ldexp(1.0, k[~normal])
    return out
