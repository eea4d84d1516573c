"""Symax: |x_i| / (eta + sum_j |x_j|). Symmetric in sign, not shift invariant."""

from __future__ import annotations

import mpmath
import numpy as np

from elasticbench.domains import ETA
from elasticbench.harness.functions.definition import (
    DENOMINATOR,
    Function,
    Param,
    RowGrad,
    RowTruth,
    has_nan,
    weight_normalize,
    weight_normalize_grad,
)


def weights(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """|x| over an array: exact."""
    a = np.abs(x)
    return a, np.zeros_like(a), np.zeros_like(a)


def reference(row: list[float], *, eta: float) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    return weight_normalize(row, lambda v: abs(mpmath.mpf(v)), constant=eta)


def gradient(row: list, g: list, *, eta: float) -> RowGrad:
    """dx_k = sign(x_k) (g_k - c) / D and deta = -c / D, D = eta + sum |x|, exactly: the
    derivative of |x| at 0 is taken as 0 (torch's); rows that are not finite (NaN, an
    infinite |x|, or D = 0) as RowGrad.constant says. Attention's gradient reference
    (functions/attention_functions.py); the rows kind verifies symax's forward only."""
    return weight_normalize_grad(reference(row, eta=eta), row, g,
                                 lambda v: abs(mpmath.mpf(v)), lambda v: mpmath.sign(v),
                                 eta, "eta")


FUNCTION = Function(
    name="symax",
    summary="symax: |x| / (eta + sum |x|)",
    reference_row=reference,
    params=(Param("eta", 1.0, ETA.lower, ETA.strict, (0.0, 1.0), "denominator offset, >= 0",
                  DENOMINATOR, span=(1e-12, 1e6)),),
    exps_per_element=0,
    weights=weights,
    weight_offset=lambda params: params["eta"],
)
