"""Stablemax: s(x_i) / sum_j s(x_j) with s(x) = x + 1 for x >= 0 and 1 / (1 - x) below.

No exponential, so no overflow of exp; the sum itself can still overflow fp16.
"""

from __future__ import annotations

import mpmath

from .base import Function, RowTruth, has_nan, weight_normalize


def s(v: float) -> mpmath.mpf:
    x = mpmath.mpf(v)
    return x + 1 if v >= 0 else 1 / (1 - x)


def reference(row: list[float]) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    return weight_normalize(row, s)


FUNCTION = Function(
    name="stablemax",
    summary="stablemax: s(x)/sum s(x), s = x+1 (x >= 0), 1/(1-x) (x < 0)",
    reference_row=reference,
    exps_per_element=0,
)
