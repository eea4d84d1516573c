"""Softmax, the baseline: exp(x_i - m) / sum_j exp(x_j - m).

A row of only -inf is fully masked: its outputs are 0 (the convention of fused attention
kernels), not the NaN that 0/0 would give.
"""

from __future__ import annotations

from elasticbench.harness.functions.definition import (
    Function,
    RowGrad,
    RowTruth,
    above_minus_inf,
    exp_normalize,
    has_nan,
    untempered_exp_grad,
)


def reference(row: list[float]) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    return exp_normalize(row, above_minus_inf)


def gradient(row: list[float], g: list[float]) -> RowGrad:
    """dx_k = y_k (g_k - sum_i g_i y_i), exactly; -inf positions get exactly 0."""
    return untempered_exp_grad(reference(row), row, g)


FUNCTION = Function(
    name="softmax",
    summary="softmax: exp(x - max) / sum exp(x - max); all -inf rows give zeros",
    reference_row=reference,
    gradient_row=gradient,
)
