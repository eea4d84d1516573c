"""Softmax1 ("attention is off by one"): exp(x_i) / (1 + sum_j exp(x_j)).

Stable form: m = max(max x, 0) and the 1 becomes exp(-m).
"""

from __future__ import annotations

import math

import mpmath

from .base import Function, RowTruth, exp_normalize, has_nan


def reference(row: list[float]) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    keep = [v > -math.inf for v in row]
    return exp_normalize(row, keep, shift_floor=0.0, extra=lambda m: mpmath.exp(-m))


FUNCTION = Function(
    name="softmax1",
    summary="softmax1: exp(x) / (1 + sum exp(x)), the 1 rescaled by exp(-m) after the shift",
    reference_row=reference,
)
