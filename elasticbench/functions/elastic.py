"""Elastic-Softmax: Negative Value Masking, then a tempered softmax with a denominator offset.

    s~_i = s_i if s_i >= 0 else -inf        (-0.0 >= 0 holds: both zeros are kept)
    y_i  = exp(s~_i / tau) / (sum_j exp(s~_j / tau) + beta)

evaluated exactly in the shifted form, where the offset is rescaled by exp(-m/tau).
"""

from __future__ import annotations

import mpmath

from .base import Function, Param, RowTruth, exp_normalize, has_nan


def reference(row: list[float], *, tau: float, beta: float) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    keep = [v >= 0 for v in row]
    b = mpmath.mpf(beta)
    t = mpmath.mpf(tau)
    return exp_normalize(
        row, keep, scale=1.0 / tau, extra=(lambda m: b * mpmath.exp(-m / t)) if beta else None
    )


FUNCTION = Function(
    name="elastic",
    summary="Elastic-Softmax: negatives masked, exp(s/tau) / (sum exp(s/tau) + beta)",
    reference_row=reference,
    params=(
        Param("tau", 1.0, 0.0, True, (0.01, 1.0, 10.0), "temperature, finite and > 0"),
        Param("beta", 1.0, 0.0, False, (0.0, 1e-10, 1.0, 100.0), "denominator offset, >= 0"),
    ),
    notes="rows sum to S/(S+beta); masked positions are exactly 0",
)
