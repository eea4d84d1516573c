"""Gated attention cases: the gate a case gives, who is given it, and how the gated output
and the gate's gradient are judged (docs/attention.md section 5, docs/numerics.md section
8.3).

A case is gated when its attention parameter `gate` is 1. A kernel that declares a `gate`
parameter is then given g, (batch, heads, length_q, value_dim) in the case's dtype with
values in (0, 1) (kinds.attention.qkv_inputs.generate_gate), and must return Y = out * g; its
backward's step(dY) returns (dq, dk, dv, *dparams, d gate). The reference is the exact
ungated truth: Y = out * g exactly (g as given), the gradients of q, k, v and the row
parameters those of the ungated attention for dO = dY * g (exact in float64 for the 16- and
32-bit formats; rounded once for fp64, which the budget pays), and d gate = dY * out
exactly. Kernels that do not declare `gate` are not given gated cases.
"""

from __future__ import annotations

import inspect

import numpy as np

from elasticbench.harness.kinds.attention.qkv_inputs import generate_gate
from elasticbench.harness.kinds.attention.scoring import TensorScore, score, verdict
from elasticbench.harness.kinds.attention.verify_matrix import AttentionCase
from elasticbench.harness.numerics.budgets.attention_budgets import Conditioning, gated_allowance
from elasticbench.harness.numerics.certified import dd
from elasticbench.harness.numerics.dtypes import FloatFormat
from elasticbench.harness.numerics.truth.attention_values import AttentionTruth
from elasticbench.harness.numerics.ulp import ulp_of
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.verify.check import CheckResult


def is_gated(case: AttentionCase) -> bool:
    """Whether the case is a gated one (its parameter gate is 1)."""
    return bool(case.param_dict.get("gate", 0.0))


def takes_gate(spec: KernelSpec) -> bool:
    """Whether the kernel declares a `gate` parameter (the only ones given gated cases)."""
    try:
        return "gate" in inspect.signature(spec.fn).parameters
    except (TypeError, ValueError):
        return False


def case_gate(case: AttentionCase) -> np.ndarray | None:
    """The gate of a gated case, in the case's format (None for an ungated one)."""
    if not is_gated(case):
        return None
    return generate_gate(case.generator, case.dtype, case.shape, case.seed)


def truth_params(params: dict[str, float]) -> dict[str, float]:
    """The parameters the ungated truth takes (gate left out: a gated case's truth is its
    ungated one's, and shares its cache)."""
    return {n: v for n, v in params.items() if n != "gate"}


def product(hi: np.ndarray, lo: np.ndarray, factor: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """(hi + lo) * factor as a double-double (factor float64, exact values of the format):
    the truth of a gated output or of d gate. NaN stays NaN."""
    f = np.asarray(factor, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        ph, pl = dd.mul_d(np.nan_to_num(hi), np.nan_to_num(lo), f)
    nan = np.isnan(hi) | np.isnan(f)
    return np.where(nan, np.nan, ph), np.where(nan, 0.0, pl)


def gated_score(name: str, got: np.ndarray, truth: AttentionTruth, cond: Conditioning,
                fmt: FloatFormat, factor: np.ndarray, nan_ok: np.ndarray,
                scale: float) -> TensorScore:
    """The score of a product out * factor (the gated output, factor = g; d gate, factor
    = dY) against its exact value, within numerics/budgets/attention_budgets.py gated_allowance."""
    hi, lo = product(truth.out_hi, truth.out_lo, factor)
    out_ulp = ulp_of(np.nan_to_num(truth.out_hi), np.nan_to_num(truth.out_lo), fmt)
    ulp = ulp_of(np.nan_to_num(hi), np.nan_to_num(lo), fmt)
    allowed = scale * gated_allowance(cond, factor, out_ulp, hi, ulp)
    return score(name, got, hi, lo, truth.out_zero, nan_ok, allowed, fmt)


def check_gated_forward(out: np.ndarray, truth: AttentionTruth, cond: Conditioning,
                        fmt: FloatFormat, gate: np.ndarray, scale: float = 1.0
                        ) -> CheckResult:
    """A gated kernel's Y against out * g, exactly."""
    if out.shape != truth.out_hi.shape:
        return CheckResult(False, f"returned shape {out.shape}, expected {truth.out_hi.shape}")
    if out.dtype != fmt.numpy:
        return CheckResult(False, f"returned dtype {out.dtype}, expected {fmt.name}")
    return verdict([gated_score("out", out, truth, cond, fmt, gate.astype(np.float64),
                                truth.out_nan_ok, scale)])


def dgate_score(got: np.ndarray, truth: AttentionTruth, cond: Conditioning, fmt: FloatFormat,
                upstream: np.ndarray, scale: float = 1.0) -> TensorScore | CheckResult:
    """d gate = dY * out against its exact value (a CheckResult where the shape or dtype is
    wrong); NaN is accepted where out may be NaN and in a head with a non-finite input."""
    if got.shape != truth.out_hi.shape:
        return CheckResult(False, f"returned dgate of shape {got.shape}, expected "
                           f"{truth.out_hi.shape}")
    if got.dtype != fmt.numpy:
        return CheckResult(False, f"returned dgate of dtype {got.dtype}, expected {fmt.name}")
    nan_ok = truth.out_nan_ok | truth.grad_nan_ok[:, :, None, None]
    return gated_score("dgate", got, truth, cond, fmt, upstream, nan_ok, scale)
