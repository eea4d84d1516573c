"""Sigmoid weights: y_i = sigmoid(x_i + bias) = 1 / (1 + exp(-(x_i + bias))), each alone.

No denominator: the weights of a row need not sum to 1 (FlashSigmoid's attention takes
bias = -ln(n) so that n keys sum to about 1). A NaN makes its own weight NaN (and, inside
attention, the query's outputs, since every weight enters the sum); sigmoid(+inf) = 1,
sigmoid(-inf) = 0. Attention only (functions/attention_functions.py `sigmoid_attention`): the rows
kind verifies normalizations over a row, and an elementwise sigmoid is not one
(docs/attention.md section 9).
"""

from __future__ import annotations

import math

import mpmath

from elasticbench.domains import BIAS
from elasticbench.harness.functions.definition import (
    ROW_FINITE,
    ROW_NAN,
    SHIFT,
    Function,
    Param,
    RowGrad,
    RowTruth,
    distinct,
)

# -ln(64): FlashSigmoid's -ln(n) for 64 keys, the longest rows of the attention matrix
MINUS_LN_64 = -math.log(64.0)


def _argument(v, bias: float):
    """x + bias exactly (an mpf; NaN and the infinities as they are)."""
    return mpmath.mpf(v) + mpmath.mpf(bias)


def reference(row: list, *, bias: float) -> RowTruth:
    """The exact weights; zabs is |x + bias|, the exponential's argument (0 where infinite);
    kind nan when an element is NaN (that element's weight None, the others exact)."""
    values, index, _ = distinct(row)
    ys: list = []
    zero: list[bool] = []
    zabs: list[float] = []
    for v in values.tolist():
        x = _argument(v, bias)
        if mpmath.isnan(x):
            ys.append(None)
            zero.append(False)
            zabs.append(0.0)
        elif mpmath.isinf(x):
            ys.append(mpmath.mpf(1 if x > 0 else 0))
            zero.append(x < 0)
            zabs.append(0.0)
        else:
            ys.append(1 / (1 + mpmath.exp(-x)))
            zero.append(False)
            zabs.append(float(abs(x)))
    kind = ROW_NAN if any(y is None for y in ys) else ROW_FINITE
    return RowTruth(ys, zero, zabs, 0.0, kind, index)


def gradient(row: list, g: list, *, bias: float) -> RowGrad:
    """dx_k = y_k (1 - y_k) g_k, formed as g_k / ((1 + exp(-x)) (1 + exp(x))) (no 1 - y_k
    to cancel), 0 where x + bias is infinite; dbias = sum_k dx_k. Elementwise: a NaN input
    makes its own dx and dbias NaN (None), no other element's."""
    truth = reference(row, bias=bias)
    dx: list = []
    zero: list[bool] = []
    for v, gk in zip(row, g, strict=True):
        x = _argument(v, bias)
        if mpmath.isnan(x):
            dx.append(None)
            zero.append(False)
        elif mpmath.isinf(x):
            dx.append(mpmath.mpf(0))
            zero.append(True)
        else:
            dx.append(mpmath.mpf(gk) / ((1 + mpmath.exp(-x)) * (1 + mpmath.exp(x))))
            zero.append(False)
    dbias = None if any(d is None for d in dx) else mpmath.fsum(dx)
    return RowGrad(truth, dx, zero, {"bias": dbias})


FUNCTION = Function(
    name="sigmoid",
    summary="sigmoid: 1 / (1 + exp(-(x + bias))), each element alone (attention only)",
    reference_row=reference,
    params=(Param("bias", 0.0, BIAS.lower, BIAS.strict, (0.0, MINUS_LN_64),
                  "added to every argument, any finite value (FlashSigmoid: -ln(n))", SHIFT,
                  span=(1e-3, 1e3)),),
    exps_per_element=1,
    notes="no normalizer: a row's weights need not sum to 1",
    gradient_row=gradient,
    normalized=False,
)
