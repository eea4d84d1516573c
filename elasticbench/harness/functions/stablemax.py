"""Stablemax: s(x_i) / sum_j s(x_j) with s(x) = x + 1 for x >= 0 and 1 / (1 - x) below.

No exponential, so no overflow of exp; the sum itself can still overflow fp16.
"""

from __future__ import annotations

import mpmath
import numpy as np

from elasticbench.harness.functions.definition import (
    Function,
    RowGrad,
    RowTruth,
    has_nan,
    weight_normalize,
    weight_normalize_grad,
)
from elasticbench.harness.numerics.certified import dd


def s(v: float) -> mpmath.mpf:
    x = mpmath.mpf(v)
    return x + 1 if v >= 0 else 1 / (1 - x)


def slope(v: float) -> mpmath.mpf:
    """s'(x): 1 for x >= 0, 1/(1 - x)^2 below (continuous at 0; 0 at -inf)."""
    x = mpmath.mpf(v)
    return mpmath.mpf(1) if v >= 0 else 1 / (1 - x) ** 2


def weights(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """s(x) over an array as a double-double, with its relative error bound: x + 1 is exact;
    1/(1 - x) has the dd division's bound, or 2^-51 where 1 - x is too large to split."""
    pos = x >= 0
    h, lo = dd.two_sum(np.where(pos, x, 1.0), np.where(pos, 1.0, -x))  # x + 1 or 1 - x
    lo = np.where(np.isfinite(h), lo, 0.0)
    splittable = np.abs(h) < 2.0**990
    safe = np.where(splittable, h, 1.0)
    qh, ql = dd.div(np.ones_like(h), np.zeros_like(h), safe, np.where(splittable, lo, 0.0))
    qh = np.where(splittable, qh, 1.0 / h)
    ql = np.where(splittable, ql, 0.0)
    rel = np.where(pos, 0.0, np.where(splittable, dd.DIV_DD * dd.U2, 2.0**-51))
    return np.where(pos, h, qh), np.where(pos, lo, ql), rel


def reference(row: list[float]) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    return weight_normalize(row, s)


def gradient(row: list, g: list) -> RowGrad:
    """dx_k = s'(x_k) (g_k - c) / sum s(x), exactly; rows that are not finite as
    RowGrad.constant says. Attention's gradient reference (functions/attention_functions.py);
    the rows kind verifies stablemax's forward only."""
    return weight_normalize_grad(reference(row), row, g, s, slope)


FUNCTION = Function(
    name="stablemax",
    summary="stablemax: s(x)/sum s(x), s = x+1 (x >= 0), 1/(1-x) (x < 0)",
    reference_row=reference,
    exps_per_element=0,
    weights=weights,
)
