"""Softmax1 ("attention is off by one"): exp(x_i) / (1 + sum_j exp(x_j)).

Stable form: m = max(max x, 0) and the 1 becomes exp(-m).
"""

from __future__ import annotations

import mpmath

from elasticbench.harness.functions.definition import (
    Function,
    RowGrad,
    RowTruth,
    above_minus_inf,
    exp_normalize,
    has_nan,
    untempered_exp_grad,
)

SHIFT_FLOOR = 0.0  # m = max(max x, 0): the 1 becomes exp(-m) and never overflows
OFFSET = 1.0  # the constant term of the denominator


def reference(row: list[float]) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    return exp_normalize(row, above_minus_inf, shift_floor=SHIFT_FLOOR,
                         extra=lambda m: OFFSET * mpmath.exp(-m))


def gradient(row: list[float], g: list[float]) -> RowGrad:
    """dx_k = y_k (g_k - sum_i g_i y_i), exactly, softmax's form: the constant 1 enters only
    through y. -inf positions get exactly 0."""
    return untempered_exp_grad(reference(row), row, g)


FUNCTION = Function(
    name="softmax1",
    summary="softmax1: exp(x) / (1 + sum exp(x)), the 1 rescaled by exp(-m) after the shift",
    reference_row=reference,
    gradient_row=gradient,
    shift_floor=SHIFT_FLOOR,
    constant_offset=OFFSET,
)
