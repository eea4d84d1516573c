"""Scoring one kernel output against the exact truth: ulps, budget, special values, contract.

Accuracy and the special-value policy are judged separately: an output can be accurate
where it is finite and still break the policy (a NaN swallowed, a masked position not
exactly 0), and the record says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from elasticbench.harness.functions.definition import ROW_FINITE, ROW_INF, ROW_MASKED
from elasticbench.harness.numerics.budgets.row_budgets import Budget
from elasticbench.harness.numerics.dtypes import FloatFormat
from elasticbench.harness.numerics.truth.row_truth import Truth
from elasticbench.harness.numerics.ulp import ulp_error, ulp_of


@dataclass
class CheckResult:
    """What scoring one output (or one dx) against the truth found; a record's verdict fields."""

    passed: bool
    reason: str
    max_ulp: float | None = None
    max_budget_frac: float | None = None
    special_ok: bool | None = None
    worst: dict[str, Any] | None = None
    failures: dict[str, int] = field(default_factory=dict)


def json_float(v: float) -> float | str:
    """A float for JSON: non-finite values as strings."""
    v = float(v)
    return v if np.isfinite(v) else str(v)


def zero_place(kind: str, x: float, *, gradient: bool = False) -> str:
    """Why an output (or a gradient) must be exactly 0 at a place, in words of what its row
    holds (docs/definitions.md section 3): the words fit every function of the family."""
    if kind == ROW_INF:
        return ("in a row with infinite weights (its output does not move)" if gradient
                else "beside the infinite weights of its row (the limit)")
    if kind == ROW_MASKED:
        return "in a row where nothing has weight"
    if x == -np.inf:
        return "at a -inf logit (weight 0)"
    if x < 0:
        return "at a masked position (negative logit)"
    return "at a logit of weight 0"


def element_error(hi: float, lo: float, got: float, err: float | None,
                  allowed: float | None, allowed_abs: float | None) -> dict[str, Any]:
    """One element's error and allowance in a unit that means something: ulps of the exact
    value hi + lo, and absolute (|got - exact| against allowed_abs, the same allowance).
    At an exact 0 the ulp is the format's smallest subnormal, so an ordinary absolute error
    counts ~1e300 ulps in fp64: there only the absolute figures are given (ulp None)."""
    exact_zero = hi == 0 and lo == 0
    out: dict[str, Any] = {
        "ulp": None if err is None or exact_zero else json_float(err),
        "allowed_ulp": None if allowed is None or exact_zero else json_float(allowed),
    }
    if err is not None and allowed_abs is not None:
        out["abs_err"] = json_float(abs((got - hi) - lo))
        out["allowed_abs"] = json_float(allowed_abs)
    return out


def describe_error(worst: dict[str, Any]) -> str:
    """A worst element's error against its allowance, as a failure reason gives it: in ulps,
    or absolute where the exact value is 0 (element_error)."""
    if isinstance(worst.get("ulp"), float) and isinstance(worst.get("allowed_ulp"), float):
        return f"{worst['ulp']:.4g} ulp > budget {worst['allowed_ulp']:.4g}"
    if isinstance(worst.get("abs_err"), float) and isinstance(worst.get("allowed_abs"), float):
        return (f"|error| {worst['abs_err']:.4g} against an exact 0 > budget "
                f"{worst['allowed_abs']:.4g} (absolute)")
    return f"got {worst.get('got', '?')}"


def position(x: np.ndarray, got: np.ndarray, truth: Truth, k: int, j: int, hi: np.ndarray,
             lo: np.ndarray, err: float | None = None, allowed: float | None = None,
             ulp_size: float | None = None) -> dict[str, Any]:
    """A record's `worst`: where (checked row k, column j) an output is judged, with the
    input, the exact value hi + lo, what the kernel gave, its error and allowance in ulps
    and, given the ulp's size there, absolute (element_error)."""
    return {
        "row": int(truth.rows[k]),
        "index": int(j),
        "input": json_float(x[truth.rows[k], j]),
        "expected": json_float(hi[k, j] + lo[k, j]),
        "got": json_float(got[k, j]),
        **element_error(float(hi[k, j]), float(lo[k, j]), float(got[k, j]), err, allowed,
                        None if allowed is None or ulp_size is None
                        else float(allowed) * ulp_size),
        "row_kind": str(truth.kind[k]),
    }


@dataclass
class Scored:
    """A kernel's outputs against exact values: the error in ulps (0 where NaN is due, inf
    where a NaN came instead of a number) and the special-value breaches."""

    err: np.ndarray
    missing_nan: np.ndarray  # NaN due, a number given
    zero_broken: np.ndarray  # exactly 0 due, something else given


def score(got: np.ndarray, hi: np.ndarray, lo: np.ndarray, zero: np.ndarray,
          want_nan: np.ndarray, ulp: np.ndarray, fmt: FloatFormat) -> Scored:
    """got (float64) scored against hi + lo, whose ulps in fmt are ulp."""
    got_nan = np.isnan(got)
    err = ulp_error(got, hi, lo, fmt, ulp)
    err[got_nan] = np.inf  # a NaN instead of a number
    err[want_nan] = 0.0  # NaN due: judged as a special value, not in ulps
    return Scored(err, want_nan & ~got_nan, zero & (got != 0))


def checked(out: np.ndarray, truth: Truth) -> np.ndarray:
    """out on the truth's rows, as float64 (out itself when it is float64 and every row is
    checked: scoring only reads it)."""
    rows = truth.rows
    every = rows.size == out.shape[0] and np.array_equal(rows, np.arange(rows.size))
    return np.asarray(out if every else out[rows], dtype=np.float64)


def worst_within(err: np.ndarray, frac: np.ndarray, judged: np.ndarray,
                 exact_zero: np.ndarray | None = None
                 ) -> tuple[float, float, tuple[int, int] | None]:
    """The largest error in ulps and the largest budget share over the judged elements, and
    where the largest share is (None when nothing is judged). Elements whose exact value is
    0 (exact_zero) count in the share but not in the ulps, which mean nothing there
    (element_error)."""
    every = judged.all()
    if not every and not judged.any():
        return 0.0, 0.0, None
    shares = frac if every else np.where(judged, frac, -1)  # a share is never negative
    k, j = np.unravel_index(np.argmax(shares), frac.shape)
    in_ulps = judged if exact_zero is None or not exact_zero.any() else judged & ~exact_zero
    worst = (np.max(err, initial=0.0) if in_ulps is judged and every
             else np.max(err, where=in_ulps, initial=0.0))
    return float(worst), float(shares[k, j]), (int(k), int(j))


def _special_reason(x: np.ndarray, got: np.ndarray, truth: Truth, k: int, j: int,
                    err: np.ndarray, allowed: np.ndarray, missing_nan: np.ndarray,
                    zero_broken: np.ndarray, ulp: np.ndarray) -> tuple[str, dict[str, Any]]:
    """Why the output at (k, j) breaks the special-value policy, and that position."""
    if missing_nan[k, j]:
        worst = position(x, got, truth, k, j, truth.hi, truth.lo)
        return f"special: NaN in row {worst['row']} not propagated (got {worst['got']})", worst
    worst = position(x, got, truth, k, j, truth.hi, truth.lo, err[k, j], allowed[k, j],
                     float(ulp[k, j]))
    if zero_broken[k, j]:
        place = zero_place(str(truth.kind[k]), float(x[truth.rows[k], j]))
        return f"special: expected exactly 0 {place}, got {worst['got']}", worst
    return (f"special: expected {worst['expected']} at an infinite weight (the limit: an "
            f"equal share each), got {worst['got']}"), worst


def check_output(
    x: np.ndarray, out: np.ndarray, truth: Truth, fmt: FloatFormat, budget: Budget
) -> CheckResult:
    """Compare a kernel's output with the truth on the truth's rows."""
    if out.shape != x.shape:
        return CheckResult(False, f"returned shape {out.shape}, expected {x.shape}")
    if out.dtype != fmt.numpy:
        return CheckResult(False, f"returned dtype {out.dtype}, expected {fmt.numpy} ({fmt.name})")
    got = checked(out, truth)
    n = x.shape[1]

    # what depends on the truth alone is derived once for every kernel judged against it
    want_nan = truth.derived("nan", lambda: np.isnan(truth.hi))
    ulp = truth.derived(("ulp", fmt.name), lambda: ulp_of(truth.hi, truth.lo, fmt))
    allowed = truth.derived(("allowed", fmt.name, budget),
                            lambda: budget.allowance(truth.zabs, truth.zbar, n, fmt))
    s = score(got, truth.hi, truth.lo, truth.zero, want_nan, ulp, fmt)
    err, missing_nan, zero_broken = s.err, s.missing_nan, s.zero_broken
    frac = err / allowed
    over = frac > 1
    special_fail = accuracy_fail = np.False_  # the usual case, a pass: nothing to count
    failures: dict[str, int] = {}
    if over.any() or missing_nan.any() or zero_broken.any():
        special_row = (truth.kind != ROW_FINITE)[:, None]
        special_fail = missing_nan | zero_broken | (over & special_row)
        accuracy_fail = over & ~special_row & ~zero_broken
        failures = {
            "nan_not_propagated": int(missing_nan.sum()),
            "masked_not_zero": int(zero_broken.sum()),
            "special_row_wrong": int((over & special_row & ~zero_broken).sum()),
            "over_budget": int(accuracy_fail.sum()),
        }
        failures = {k: v for k, v in failures.items() if v}
    # The worst error where the special-value policy held: a policy failure (a NaN where 0
    # is due, say) is reported apart and does not hide how accurate the rest is.
    exact_zero = truth.derived("exact_zero", lambda: (truth.hi == 0) & (truth.lo == 0))
    max_ulp, max_frac, at = worst_within(err, frac, ~want_nan & ~special_fail, exact_zero)
    if special_fail.any():
        k, j = np.argwhere(special_fail)[0]
        reason, worst = _special_reason(x, got, truth, k, j, err, allowed, missing_nan,
                                        zero_broken, ulp)
        return CheckResult(False, reason, max_ulp, max_frac, False, worst, failures)
    worst = None if at is None else position(x, got, truth, *at, truth.hi, truth.lo,
                                             err[at], allowed[at], float(ulp[at]))
    if accuracy_fail.any():
        reason = f"accuracy: {describe_error(worst) if worst else 'got ?'}"
        return CheckResult(False, reason, max_ulp, max_frac, True, worst, failures)
    return CheckResult(True, "", max_ulp, max_frac, True, worst, failures)
