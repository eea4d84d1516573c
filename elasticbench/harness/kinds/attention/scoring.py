"""Scoring an attention kernel's output (or gradients) against the exact truth.

Each tensor is judged element by element in ulps of its format against the allowance of
numerics/budgets/attention_budgets.py, and separately against the special-value policy of
docs/attention.md section 3: NaN where NaN is due, exactly 0 where nothing reaches an
element, and no NaN where a finite value is due (except where the policy accepts one:
a non-finite v_j at weight 0, or gradients in a head with a non-finite input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from elasticbench.harness.functions import AttentionFunction
from elasticbench.harness.functions.definition import DENOMINATOR, OFFSET, SHIFT, TEMPERATURE
from elasticbench.harness.numerics.budgets.attention_budgets import Conditioning, gradient_allowance
from elasticbench.harness.numerics.dtypes import FloatFormat
from elasticbench.harness.numerics.truth.attention_truth import AttentionTruth
from elasticbench.harness.numerics.ulp import ulp_error, ulp_of
from elasticbench.harness.verify.backward import ParamCheck
from elasticbench.harness.verify.check import (
    CheckResult,
    describe_error,
    element_error,
    json_float,
)


@dataclass
class TensorScore:
    """One tensor's errors: ulps, budget fractions, what broke the policy."""

    name: str
    err: np.ndarray
    frac: np.ndarray
    missing_nan: np.ndarray
    zero_broken: np.ndarray
    spurious_nan: np.ndarray
    hi: np.ndarray
    lo: np.ndarray
    got: np.ndarray
    allowed_ulp: np.ndarray
    allowed_abs: np.ndarray  # the same allowance, absolute (hi's shape)

    @property
    def special(self) -> np.ndarray:
        return self.missing_nan | self.zero_broken | self.spurious_nan

    @property
    def judged(self) -> np.ndarray:
        return ~np.isnan(self.hi) & ~self.special & ~np.isnan(self.got)

    def position(self, idx: tuple) -> dict[str, Any]:
        """A record's `worst`: the tensor and index, exact value, what came, ulps."""
        flat = int(np.ravel_multi_index(idx[:-1], self.hi.shape[:-1]))
        return {"row": flat, "index": int(idx[-1]), "input": f"{self.name}{list(map(int, idx))}",
                "expected": json_float(self.hi[idx] + self.lo[idx]),
                "got": json_float(self.got[idx]),
                **element_error(float(self.hi[idx]), float(self.lo[idx]), float(self.got[idx]),
                                float(self.err[idx]), float(self.allowed_ulp[idx]),
                                float(self.allowed_abs[idx])),
                "tensor": self.name}

    @property
    def exact_zero(self) -> np.ndarray:
        """Where the exact value is 0: judged absolutely, its ulps meaning nothing."""
        return (self.hi == 0) & (self.lo == 0)


def score(name: str, got: np.ndarray, hi: np.ndarray, lo: np.ndarray, zero: np.ndarray,
          nan_ok: np.ndarray, allowed_abs: np.ndarray, fmt: FloatFormat) -> TensorScore:
    g = got.astype(np.float64)
    want_nan = np.isnan(hi)
    got_nan = np.isnan(g)
    ulp = ulp_of(np.nan_to_num(hi), np.nan_to_num(lo), fmt)
    h0, l0 = np.nan_to_num(hi), np.nan_to_num(lo)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(want_nan | got_nan, 0.0, ulp_error(g, h0, l0, fmt))
        allowed = allowed_abs / ulp
        # judged in absolute terms: at an exact 0 both sides in ulps overflow
        frac = np.where(want_nan | got_nan, 0.0, np.abs((g - h0) - l0) / allowed_abs)
    frac = np.where(np.isnan(frac), np.inf, frac)
    zero_b = zero & (g != 0) & ~(got_nan & nan_ok)
    return TensorScore(name, err, frac, want_nan & ~got_nan, zero_b,
                       got_nan & ~want_nan & ~nan_ok, hi, lo, g, allowed,
                       np.broadcast_to(allowed_abs, hi.shape))


def verdict(scores: list[TensorScore], params: list[ParamCheck] | None = None) -> CheckResult:
    """The record's verdict from every tensor's score (and the parameters' checks)."""
    failures: dict[str, int] = {}
    for s in scores:
        for key, arr in (("nan_not_propagated", s.missing_nan), ("not_exactly_zero",
                                                                 s.zero_broken),
                         ("spurious_nan", s.spurious_nan), ("over_budget",
                                                            s.judged & (s.frac > 1))):
            if arr.any():
                failures[f"{key}" if len(scores) == 1 else f"{s.name}:{key}"] = int(arr.sum())
    for p in params or []:
        if not p.passed:
            failures[p.reason.partition(":")[2].split()[0]] = 1
    judged = [(s, s.judged) for s in scores if s.judged.any()]
    # ulps where the exact value is not 0 (at an exact 0 only the share means something)
    max_ulp = max((float(s.err[m & ~s.exact_zero].max(initial=0.0)) for s, m in judged),
                  default=0.0)
    max_frac = max((float(s.frac[m].max()) for s, m in judged), default=0.0)
    for s in scores:
        if s.special.any():
            idx = tuple(np.argwhere(s.special)[0])
            w = s.position(idx)
            at = f"{s.name}{list(map(int, idx))}"
            if s.missing_nan[idx]:
                why = f"special: NaN due at {at} not propagated (got {w['got']})"
            elif s.zero_broken[idx]:
                why = f"special: expected exactly 0 at {at} (nothing reaches it), got {w['got']}"
            else:
                why = f"special: NaN at {at} where {w['expected']} is due"
            return CheckResult(False, why, max_ulp, max_frac, False, w, failures)
    bad_special = [p for p in params or [] if not p.passed and p.reason.startswith("special")]
    if bad_special:
        return CheckResult(False, bad_special[0].reason, max_ulp, max_frac, False, None,
                           failures)
    worst = None
    if judged:
        s, m = max(judged, key=lambda sm: float(sm[0].frac[sm[1]].max()))
        idx = np.unravel_index(np.argmax(np.where(m, s.frac, -1)), s.frac.shape)
        worst = s.position(tuple(idx))
        if s.frac[idx] > 1:
            return CheckResult(False, f"accuracy: {s.name} {describe_error(worst)}", max_ulp,
                               max_frac, True, worst, failures)
    bad = [p for p in params or [] if not p.passed]
    if bad:
        return CheckResult(False, bad[0].reason, max_ulp, max_frac, True, worst, failures)
    return CheckResult(True, "", max_ulp, max_frac, True, worst, failures)


def check_forward(out: np.ndarray, truth: AttentionTruth, cond: Conditioning,
                  fmt: FloatFormat, scale: float = 1.0) -> CheckResult:
    """out in ulps of the format against its allowance times the run's budget scale."""
    if out.shape != truth.out_hi.shape:
        return CheckResult(False, f"returned shape {out.shape}, expected {truth.out_hi.shape}")
    if out.dtype != fmt.numpy:
        return CheckResult(False, f"returned dtype {out.dtype}, expected {fmt.name}")
    ulp = ulp_of(np.nan_to_num(truth.out_hi), np.nan_to_num(truth.out_lo), fmt)
    s = score("out", out, truth.out_hi, truth.out_lo, truth.out_zero, truth.out_nan_ok,
              scale * cond.out_allowance(ulp), fmt)
    return verdict([s])


# which allowance of numerics/budgets/attention_budgets.py gradient_allowance judges a parameter
_ROLE_KEY = {TEMPERATURE: "tau", OFFSET: "beta", DENOMINATOR: "eta", SHIFT: "bias"}


def _param_check(name: str, got: np.ndarray, hi: np.ndarray, lo: np.ndarray,
                 allowed: np.ndarray, nan_ok: np.ndarray) -> ParamCheck:
    """A row parameter's gradient per (batch, head), judged relatively over all of them."""
    want_nan = np.isnan(hi)
    if (want_nan & ~np.isnan(got)).any():
        return ParamCheck(float(got.ravel()[0]), float("nan"), float("inf"), 0.0, False,
                          f"special: d{name} NaN due in a head with a NaN query")
    ok = ~want_nan & ~(np.isnan(got) & nan_ok)
    if (~np.isfinite(got[ok])).any():
        return ParamCheck(float(got[ok][~np.isfinite(got[ok])][0]), float(hi[ok][0]),
                          float("inf"), 0.0, False, f"special: d{name} is not finite where "
                          "a finite value is due")
    err = np.abs((got[ok] - hi[ok]) - lo[ok])
    scale = np.maximum(np.abs(hi[ok]), 2.0**-1022)
    rel, allowed_rel = err / scale, allowed[ok] / scale
    if not ok.any():
        return ParamCheck(float("nan"), float("nan"), 0.0, 0.0, True, "")
    k = int(np.argmax(rel / allowed_rel))
    passed = bool((rel <= allowed_rel).all())
    reason = "" if passed else (f"accuracy: d{name} relative error {rel[k]:.3g} > budget "
                                f"{allowed_rel[k]:.3g} (expected {hi[ok][k]:.9g}, got "
                                f"{got[ok][k]:.9g})")
    return ParamCheck(float(got[ok][k]), float(hi[ok][k]), float(rel[k]),
                      float(allowed_rel[k]), passed, reason)


def check_backward(grads: list[np.ndarray], truth: AttentionTruth, cond: Conditioning,
                   fn: AttentionFunction, dout: np.ndarray, saved_out: np.ndarray,
                   fmt: FloatFormat, scale: float = 1.0, rounded_dout: bool = False,
                   extra: tuple[TensorScore, ...] = ()
                   ) -> tuple[CheckResult, dict[str, ParamCheck]]:
    """dq, dk, dv in ulps of the format; each row parameter's gradient relatively (every
    allowance times the run's budget scale). A gated case's: dout the reference's dY * g,
    rounded_dout (the kernel rounds it to its format), and d gate's score in extra
    (kinds/attention/gating.py)."""
    names = ("dq", "dk", "dv")
    want = [truth.dq_hi, truth.dk_hi, truth.dv_hi]
    for n, g, w in zip(names, grads[:3], want, strict=True):
        if g.shape != w.shape:
            return CheckResult(False, f"returned {n} of shape {g.shape}, expected {w.shape}"), {}
        if g.dtype != fmt.numpy:
            return CheckResult(False, f"returned {n} of dtype {g.dtype}, expected {fmt.name}"), {}
    his = {"dq": (truth.dq_hi, truth.dq_lo, truth.dzero_q),
           "dk": (truth.dk_hi, truth.dk_lo, truth.dzero_k),
           "dv": (truth.dv_hi, truth.dv_lo, truth.dzero_v)}
    ulps = {n: ulp_of(np.nan_to_num(hi), np.nan_to_num(lo), fmt) for n, (hi, lo, _) in his.items()}
    allowed = {k: scale * v for k, v in gradient_allowance(cond, dout, saved_out, ulps,
                                                           rounded_dout).items()}
    head_ok = truth.grad_nan_ok[:, :, None, None]
    scores = []
    for n, g in zip(names, grads[:3], strict=True):
        hi, lo, zero = his[n]
        nan_ok = np.broadcast_to(head_ok, hi.shape)
        scores.append(score(n, g, hi, lo, zero, nan_ok,
                            allowed[n], fmt))
    checks: dict[str, ParamCheck] = {}
    for j, p in enumerate(fn.row.params):
        got = np.asarray(grads[3 + j], dtype=np.float64).reshape(truth.dp_hi.shape[:2])
        checks[p.name] = _param_check(p.name, got, truth.dp_hi[..., j], truth.dp_lo[..., j],
                                      allowed[_ROLE_KEY[p.role]], truth.grad_nan_ok)
    return verdict([*scores, *extra], list(checks.values())), checks
