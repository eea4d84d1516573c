"""Elastic-Softmax: Negative Value Masking, then a tempered softmax with a denominator offset.

    s~_i = s_i if s_i >= 0 else -inf        (-0.0 >= 0 holds: both zeros are kept)
    y_i  = exp(s~_i / tau) / (sum_j exp(s~_j / tau) + beta)

evaluated exactly in the shifted form, where the offset is rescaled by exp(-m/tau).
"""

from __future__ import annotations

from typing import Any

import mpmath

from elasticbench.domains import BETA, TAU
from elasticbench.harness.functions.definition import (
    OFFSET,
    ROW_FINITE,
    TEMPERATURE,
    Function,
    Param,
    RowGrad,
    RowTruth,
    exp_normalize,
    exp_normalize_grad,
    has_nan,
)


def kept(s: Any) -> Any:
    """Negative Value Masking: the logits >= 0 are kept (-0.0 too); s a float or an array."""
    return s >= 0


def reference(row: list[float], *, tau: float, beta: float) -> RowTruth:
    if has_nan(row):
        return RowTruth.nan(len(row))
    b = mpmath.mpf(beta)
    t = mpmath.mpf(tau)
    return exp_normalize(
        row, kept, tau=tau, extra=(lambda m: b * mpmath.exp(-m / t)) if beta else None
    )


def gradient(row: list[float], g: list[float], *, tau: float, beta: float) -> RowGrad:
    """dx, and this row's dtau and dbeta, for upstream g (docs/gradients.md section 1), exactly.

    Evaluated in the shifted form so that nothing cancels at huge logits: with
    z'_i = (s_i - m)/tau, D' = sum_j exp(z'_j) + beta exp(-m/tau) and w = beta exp(-m/tau)/D'
    (the offset's share, 1 - sum y),
        sum_k y_k z_k - z_i = sum_k y_k z'_k - w m/tau - z'_i,   dbeta = -c exp(-m/tau)/D'.
    """
    truth = reference(row, tau=tau, beta=beta)
    if truth.kind != ROW_FINITE:
        return RowGrad.constant(truth, ("tau", "beta"))
    keep = [kept(v) for v in row]
    t, b = mpmath.mpf(tau), mpmath.mpf(beta)
    c, dx, zero = exp_normalize_grad(truth, g, keep, 1 / t)
    m = mpmath.mpf(max(v for v, k in zip(row, keep, strict=True) if k))
    zs = [(mpmath.mpf(v) - m) / t if k else mpmath.mpf(0) for v, k in zip(row, keep, strict=True)]
    e_m = mpmath.exp(-m / t)
    den = mpmath.fsum(mpmath.exp(z) for z, k in zip(zs, keep, strict=True) if k) + b * e_m
    q = e_m / den  # exp(-m/tau) / D', i.e. 1/D
    mean_z = mpmath.fsum(y * z for y, z in zip(truth.y, zs, strict=True)) - b * q * m / t
    gm = [mpmath.mpf(v) for v in g]
    dtau = mpmath.fsum(gi * yi * (mean_z - zi) for gi, yi, zi in zip(gm, truth.y, zs, strict=True)) / t
    return RowGrad(truth, dx, zero, {"tau": dtau, "beta": -c * q})


FUNCTION = Function(
    name="elastic",
    summary="Elastic-Softmax: negatives masked, exp(s/tau) / (sum exp(s/tau) + beta)",
    reference_row=reference,
    params=(
        Param("tau", 1.0, TAU.lower, TAU.strict, (0.01, 1.0, 10.0), "temperature, finite and > 0",
              TEMPERATURE, span=(1e-3, 1e3)),
        Param("beta", 1.0, BETA.lower, BETA.strict, (0.0, 1e-10, 1.0, 100.0), "denominator offset, >= 0",
              OFFSET, span=(1e-12, 1e6)),
    ),
    notes="rows sum to S/(S+beta); masked positions are exactly 0",
    gradient_row=gradient,
    kept=kept,
)
