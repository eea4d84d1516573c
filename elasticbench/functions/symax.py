"""Symax: |x_i| / (eta + sum_j |x_j|). Symmetric in sign, not shift invariant."""

from __future__ import annotations

import mpmath
import numpy as np

from .base import Function, Param, RowTruth, has_nan, weight_normalize


def weights(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """|x| over an array: exact."""
    a = np.abs(x)
    return a, np.zeros_like(a), np.zeros_like(a)


def reference(row: list[float], *, eta: float) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    return weight_normalize(row, lambda v: abs(mpmath.mpf(v)), constant=eta)


FUNCTION = Function(
    name="symax",
    summary="symax: |x| / (eta + sum |x|)",
    reference_row=reference,
    params=(Param("eta", 1.0, 0.0, False, (0.0, 1.0), "denominator offset, >= 0",
                  span=(1e-12, 1e6)),),
    exps_per_element=0,
    weights=weights,
    weight_offset=lambda params: params["eta"],
)
