"""The own-format contract for attention: budgets of a 16-bit kernel that computes in its format.

Under the wide contract (numerics/budgets/attention_budgets.py) a 16-bit attention kernel computes
its scores, weights and weighted sum in fp32 (u_w = 2^-24) and rounds them to its format
where a flash kernel does: the weights before p @ v, the output, and in the backward ds and
the saved output. A kernel declared `accuracy="own"` rounds every step to its format
instead, as eager code does in fp16 or bf16:

    s = (q @ k^T) * scale    -> the format
    w = weights(s)           -> the format (the shift, the division by tau, the exponential,
                                the sum and the division, each rounded)
    out = w @ v              -> the format

Its allowance is the wide analysis term for term with u_w the format's own unit roundoff
(2^-11 for fp16, 2^-8 for bf16), as the rows' own contract gives fp16 and bf16 the fp32 row
with their own u (docs/numerics.md section 3.1):

- a score's dot product: g u sigma_ij, g = log2(D) + 2 roundings (a kernel that accumulates
  q @ k^T in fp32 and rounds once makes one of them);
- the weights: a + b|z| + c zbar (exp family), a + d log2 Lk + g sum rho (weight-normalize),
  a + (1 - w)(b|x| + g sigma) (sigmoid), now each rounding at u;
- the sums over keys: d log2(Lk) u, no longer negligible;
- the final rounding (r ulp) and the weights rounded to the format before p @ v (l): the
  terms the wide contract already counts at the format's u.

One thing changes with the unit's size: the analysis is first order, a weight's relative
error 2 u eps_ij for an error eps_ij u in its exponent. In fp32 that is far below 1; in fp16
at tau = 0.01 with scores in the hundreds a score's own rounding (0.25 at 300) moves z by
25, and the weight by a factor e^25, not 1 + 25. So under `own` the exponential forms
(the exp family, sigmoid, cog's softmax of |s|) take the exact bound: a weight's relative
error expm1(2 u eps_ij) (its first-order value where that is small), and never more than 1
absolutely, a weight lying in [0, 1] (2 for cog's signed weight); likewise dw_ij, capped by
its largest value (1/tau; 1/4 for sigmoid, 1 for cog).

A weight under the format's normal range is off by the format's subnormal step (sub_w), and
a row parameter's gradient is judged relatively down to the format's smallest normal. The
gradients follow gradient_allowance with the same u: ds, dp and c_i each formed in the
format. The coefficients are the wide ones (ATTENTION_BUDGETS): only u changes.

fp32 and fp64 kernels compute in their own format under either contract, so for them `own`
is `wide`: the same budget, the same allowance.
"""

from __future__ import annotations

import numpy as np

from elasticbench.harness.functions import AttentionFunction
from elasticbench.harness.numerics.budgets.attention_budgets import (
    ATTENTION_BUDGETS,
    EXP,
    SIGMOID,
    SIGNED,
    AttentionBudget,
    Conditioning,
)
from elasticbench.harness.numerics.contract import OWN, check_accuracy
from elasticbench.harness.numerics.dtypes import FloatFormat
from elasticbench.harness.numerics.truth.attention_values import AttentionTruth

# The same coefficients in every format: under `own` a 16-bit kernel's budget is the fp32
# analysis with its own unit roundoff (only the unit changes: docs/numerics.md section 9).
OWN_ATTENTION_BUDGETS: dict[str, AttentionBudget] = dict(ATTENTION_BUDGETS)
SIXTEEN_BIT = ("fp16", "bf16")


def attention_budget(fmt: FloatFormat, accuracy: str) -> AttentionBudget:
    """The coefficients of an attention kernel's budget in fmt under its contract."""
    table = OWN_ATTENTION_BUDGETS if check_accuracy(accuracy) == OWN else ATTENTION_BUDGETS
    return table[fmt.name]


def work_format(fmt: FloatFormat, accuracy: str) -> FloatFormat | None:
    """The format the budget's u_w is taken from where it is not the wide one's: fmt itself
    for a 16-bit kernel under `own`; None (fp32, or fp64 for fp64) otherwise."""
    return fmt if check_accuracy(accuracy) == OWN and fmt.name in SIXTEEN_BIT else None


def differs(fmt: FloatFormat, accuracy: str) -> bool:
    """Whether accuracy's allowance in fmt is not the wide contract's."""
    return work_format(fmt, accuracy) is not None


def conditioning(fn: AttentionFunction, params: dict[str, float], q: np.ndarray,
                 k: np.ndarray, v: np.ndarray, scale: float, truth: AttentionTruth,
                 fmt: FloatFormat, accuracy: str, bias: np.ndarray | None = None
                 ) -> Conditioning:
    """The Conditioning (every allowance's terms) of a kernel under its contract."""
    cond = Conditioning(fn, params, q, k, v, scale, truth, fmt, attention_budget(fmt, accuracy),
                        bias, work=work_format(fmt, accuracy))
    if differs(fmt, accuracy) and cond.form in (EXP, SIGMOID, SIGNED):
        _exponential_bound(cond)
    return cond


def _saturated(value: np.ndarray, err: np.ndarray, two_u: float, cap: float) -> np.ndarray:
    """err (an absolute error of value, in units of two_u, first order in the exponent)
    made exact: value expm1(two_u err / value), at most cap, in the same units."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        rel = two_u * err / np.where(value > 0, value, 1)
        exact = np.minimum(value * np.expm1(rel), cap) / two_u
    return np.where(value > 0, np.maximum(exact, err), err)


def _exponential_bound(cond: Conditioning) -> None:
    """The weights' and their derivatives' allowances past first order (module docstring):
    weps and dwe of an exponential form, in place."""
    two_u = 2 * cond.uw
    # a weight lies in [0, 1] (cog's in [-1, 1], |w| = p: a flipped sign is 2p off)
    cond.weps = _saturated(cond.w, cond.weps, two_u, 2.0 if cond.form == SIGNED else 1.0)
    cap = {SIGMOID: 0.25, SIGNED: 1.0}.get(cond.form, 1 / cond.tau)
    cond.dwe = _saturated(cond.dw, cond.dwe, two_u, cap)
