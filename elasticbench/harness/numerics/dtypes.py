"""The four floating-point formats the suite verifies, described once.

Every other module asks this one for a format's precision, exponent range, NumPy dtype
(bfloat16 comes from ml_dtypes) and the conversions that go with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: p significand bits (implicit bit included), emin."""

    name: str
    p: int
    emin: int
    emax: int
    numpy: np.dtype

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def max(self) -> float:
        return float(ml_dtypes.finfo(self.numpy).max)

    @property
    def unit_roundoff(self) -> float:
        return 2.0 ** (-self.p)

    @property
    def min_ulp(self) -> float:
        """Spacing of the subnormals: the smallest ulp the format has."""
        return 2.0 ** (self.emin - self.p + 1)

    @property
    def ln_max(self) -> float:
        """The largest argument whose exponential is still finite in this format."""
        return float(np.log(np.float64(self.max)))

    def round_down(self, value: float) -> float:
        """The largest value of this format that is <= value (finite, normal range)."""
        r = float(self.cast(np.array([value]))[0])
        if r > value:
            r -= 2.0 ** (int(np.floor(np.log2(abs(r)))) - self.p + 1)
        return r

    def cast(self, values: np.ndarray) -> np.ndarray:
        """Round float64 values to this format (round to nearest even)."""
        return np.asarray(values, dtype=np.float64).astype(self.numpy)


FORMATS: dict[str, FloatFormat] = {
    "fp64": FloatFormat("fp64", 53, -1022, 1023, np.dtype(np.float64)),
    "fp32": FloatFormat("fp32", 24, -126, 127, np.dtype(np.float32)),
    "fp16": FloatFormat("fp16", 11, -14, 15, np.dtype(np.float16)),
    "bf16": FloatFormat("bf16", 8, -126, 127, np.dtype(ml_dtypes.bfloat16)),
}

DTYPE_NAMES: tuple[str, ...] = tuple(FORMATS)


def get_format(name: str) -> FloatFormat:
    """Look a format up by its short name (fp64, fp32, fp16, bf16)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown dtype {name!r} (choose from {', '.join(DTYPE_NAMES)})"
        ) from None


def check_dtypes(names: Iterable[str]) -> tuple[str, ...]:
    """The names, each checked to be a format's (ValueError naming the first that is not)."""
    names = tuple(names)
    for name in names:
        get_format(name)
    return names


def work_format(fmt: FloatFormat) -> tuple[float, float, float]:
    """(unit roundoff, smallest normal, smallest subnormal) of the precision kernels
    accumulate in: fp64 for fp64, fp32 for the rest."""
    if fmt.name == "fp64":
        return 2.0**-53, 2.0**-1022, 2.0**-1074
    return 2.0**-24, 2.0**-126, 2.0**-149
