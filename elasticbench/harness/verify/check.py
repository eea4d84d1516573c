"""Scoring one kernel output against the exact truth: ulps, budget, special values, contract.

Accuracy and the special-value policy are judged separately: an output can be accurate
where it is finite and still break the policy (a NaN swallowed, a masked position not
exactly 0), and the record says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from elasticbench.harness.functions.base import ROW_FINITE, ROW_INF, ROW_MASKED
from elasticbench.harness.numerics.budgets.rows import Budget
from elasticbench.harness.numerics.dtypes import FloatFormat
from elasticbench.harness.numerics.truth.rows import Truth
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


def position(x: np.ndarray, got: np.ndarray, truth: Truth, k: int, j: int, hi: np.ndarray,
             lo: np.ndarray, err: float | None = None, allowed: float | None = None
             ) -> dict[str, Any]:
    """A record's `worst`: where (checked row k, column j) an output is judged, with the
    input, the exact value hi + lo, what the kernel gave, its error and allowance in ulps."""
    return {
        "row": int(truth.rows[k]),
        "index": int(j),
        "input": json_float(x[truth.rows[k], j]),
        "expected": json_float(hi[k, j] + lo[k, j]),
        "got": json_float(got[k, j]),
        "ulp": None if err is None else json_float(err),
        "allowed_ulp": None if allowed is None else json_float(allowed),
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


def worst_within(err: np.ndarray, frac: np.ndarray, judged: np.ndarray
                 ) -> tuple[float, float, tuple[int, int] | None]:
    """The largest error and budget share over the judged elements, and where the largest
    share is (None when nothing is judged)."""
    every = judged.all()
    if not every and not judged.any():
        return 0.0, 0.0, None
    shares = frac if every else np.where(judged, frac, -1)  # a share is never negative
    k, j = np.unravel_index(np.argmax(shares), frac.shape)
    worst = np.max(err, initial=-np.inf) if every else np.max(err, where=judged,
                                                             initial=-np.inf)
    return float(worst), float(shares[k, j]), (int(k), int(j))


def _special_reason(x: np.ndarray, got: np.ndarray, truth: Truth, k: int, j: int,
                    err: np.ndarray, allowed: np.ndarray, missing_nan: np.ndarray,
                    zero_broken: np.ndarray) -> tuple[str, dict[str, Any]]:
    """Why the output at (k, j) breaks the special-value policy, and that position."""
    if missing_nan[k, j]:
        worst = position(x, got, truth, k, j, truth.hi, truth.lo)
        return f"special: NaN in row {worst['row']} not propagated (got {worst['got']})", worst
    worst = position(x, got, truth, k, j, truth.hi, truth.lo, err[k, j], allowed[k, j])
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
    max_ulp, max_frac, at = worst_within(err, frac, ~want_nan & ~special_fail)
    if special_fail.any():
        k, j = np.argwhere(special_fail)[0]
        reason, worst = _special_reason(x, got, truth, k, j, err, allowed, missing_nan,
                                        zero_broken)
        return CheckResult(False, reason, max_ulp, max_frac, False, worst, failures)
    worst = None if at is None else position(x, got, truth, *at, truth.hi, truth.lo,
                                             err[at], allowed[at])
    if accuracy_fail.any():
        reason = (f"accuracy: {worst['ulp']:.4g} ulp > budget {worst['allowed_ulp']:.4g}"
                  if worst and isinstance(worst["ulp"], float)
                  else f"accuracy: got {worst['got'] if worst else '?'}")
        return CheckResult(False, reason, max_ulp, max_frac, True, worst, failures)
    return CheckResult(True, "", max_ulp, max_frac, True, worst, failures)
