"""Cog weights (signed attention, Lv et al.): y_i = sign(x_i) exp(|x_i|) / sum_j exp(|x_j|).

Stable form: m = max_j |x_j|, p_j = exp(|x_j| - m) / sum_k exp(|x_k| - m), y_j = sign(x_j) p_j,
so the weights lie in (-1, 1) and sum_j |y_j| = 1 off exact zeros. A zero score weighs
exactly 0 (sign(0) = 0) but its exp(0 - m) stays in the denominator. An infinite |x|
(x = +inf or -inf) gives the limit: sign(x)/n over the n infinite elements, 0 elsewhere.
A NaN makes the row NaN. An empty row is exactly 0. Attention only
(functions/attention_functions.py `cog_attention`; docs/attention.md section 9): the rows kind
verifies nonnegative normalizations, and these weights are signed.

Gradient for an upstream g (docs/attention.md section 9), with c = sum_j y_j g_j:

    dx_k = p_k g_k - y_k c = p_k (g_k - sign(x_k) c)

since d exp(|x|)/dx = sign(x) exp(|x|) and sign(x)^2 = 1 off 0; at x = 0, where the weight
jumps, the mean of the two one-sided derivatives: p_k g_k (the formula with sign(0) = 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mpmath

from elasticbench.harness.functions.definition import (
    ROW_FINITE,
    ROW_INF,
    Function,
    RowGrad,
    RowTruth,
    distinct,
    has_nan,
)


def _sign(x: Any) -> mpmath.mpf:
    """sign(x) as an mpf: -1, 0 or 1 (0 for +0.0 and -0.0)."""
    return mpmath.mpf(mpmath.sign(mpmath.mpf(x)))


def reference(row: Sequence[Any]) -> RowTruth:
    """The exact signed weights of one row (floats or mpf values). zabs is m - |x_j|, the
    exponent's argument's size (0 in the infinite limit), zbar its p-weighted mean;
    group_zero marks the weights that are exactly 0 (zero scores, and the finite scores of
    an infinite row)."""
    n = len(row)
    if n == 0:
        return RowTruth.masked(0)
    if has_nan(row):
        return RowTruth.nan(n)
    values, index, counts = distinct(row)
    xs = [mpmath.mpf(v) for v in values.tolist()]
    big = [bool(mpmath.isinf(x)) for x in xs]
    if any(big):
        share = mpmath.mpf(1) / sum(c for c, b in zip(counts, big, strict=True) if b)
        ys = [_sign(x) * share if b else mpmath.mpf(0) for x, b in zip(xs, big, strict=True)]
        return RowTruth(ys, [not b for b in big], [0.0] * len(xs), 0.0, ROW_INF, index)
    a = [abs(x) for x in xs]
    m = max(a)
    za = [m - ai for ai in a]
    e = [mpmath.exp(-z) for z in za]
    den = mpmath.fsum(c * ei for c, ei in zip(counts, e, strict=True))
    p = [ei / den for ei in e]
    zbar = mpmath.fsum(c * pi * z for c, pi, z in zip(counts, p, za, strict=True))
    ys = [_sign(x) * pi for x, pi in zip(xs, p, strict=True)]
    return RowTruth(ys, [x == 0 for x in xs], [float(z) for z in za], float(zbar),
                    ROW_FINITE, index)


def magnitudes(truth: RowTruth, row: Sequence[Any]) -> list:
    """p_j = exp(|x_j| - m) / den for every element of a finite row (|y_j| off zero
    scores, where y_j = 0 but p_j is not)."""
    if truth.kind != ROW_FINITE:
        raise ValueError("magnitudes are defined for finite rows only")
    a = [abs(mpmath.mpf(v)) for v in row]
    m = max(a)
    e = [mpmath.exp(ai - m) for ai in a]
    den = mpmath.fsum(e)
    return [ei / den for ei in e]


def gradient(row: Sequence[Any], g: Sequence[Any]) -> RowGrad:
    """dx_k = p_k g_k - y_k c, c = sum_j y_j g_j, exactly (module docstring); rows that
    are not finite as RowGrad.constant says (NaN, or exactly 0 for infinite and empty rows).

    For the row's largest p_k, when it is alone and its score is not 0, g_k - sign_k c is
    formed as sum_{j != k} p_j (g_k - sign_k sign_j g_j) (the same number, since
    sum_j p_j = 1): as p_k nears 1 the difference cancels to far below any fixed working
    precision, and this form does not."""
    truth = reference(row)
    if truth.kind != ROW_FINITE:
        return RowGrad.constant(truth, ())
    xs = list(row)
    n = len(xs)
    p = magnitudes(truth, xs)
    sg = [_sign(v) for v in xs]
    gm = [mpmath.mpf(v) for v in g]
    c = mpmath.fsum(sj * pj * gj for sj, pj, gj in zip(sg, p, gm, strict=True))
    diff = [gk - sk * c for gk, sk in zip(gm, sg, strict=True)]
    top = max(p)
    tops = [k for k in range(n) if p[k] == top]
    if len(tops) == 1 and sg[tops[0]] != 0:
        k = tops[0]
        diff[k] = mpmath.fsum(p[j] * (gm[k] - sg[k] * sg[j] * gm[j]) for j in range(n)
                              if j != k)
    dx = [pk * dk for pk, dk in zip(p, diff, strict=True)]
    return RowGrad(truth, dx, [False] * n, {})


FUNCTION = Function(
    name="cog",
    summary="cog: sign(x) exp(|x|) / sum exp(|x|), signed weights (attention only)",
    reference_row=reference,
    exps_per_element=1,
    notes="signed weights in (-1, 1): sum |y| = 1 off exact zeros",
    gradient_row=gradient,
)
