"""Softmax, the baseline: exp(x_i - m) / sum_j exp(x_j - m).

A row of only -inf is fully masked: its outputs are 0 (the convention of fused attention
kernels), not the NaN that 0/0 would give.
"""

from __future__ import annotations

import math

from .base import Function, RowTruth, exp_normalize, has_nan


def reference(row: list[float]) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    return exp_normalize(row, [v > -math.inf for v in row])


FUNCTION = Function(
    name="softmax",
    summary="softmax: exp(x - max) / sum exp(x - max); all -inf rows give zeros",
    reference_row=reference,
)
