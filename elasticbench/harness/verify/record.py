"""The one place a VerifyRecord is made: a kernel, a case, what its call gave and the verdict,
whatever the kind of kernel."""

from __future__ import annotations

from typing import Any, Protocol

from elasticbench.harness.backends import get_backend
from elasticbench.harness.numerics.contract import Judging
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.verify.case import Case
from elasticbench.harness.verify.check import CheckResult

WIDE_X1 = Judging()  # the default contract at scale 1


class Called(Protocol):
    """What every kind's call outcome says about the call itself."""

    error: str | None
    seconds: float
    raised: dict[str, Any] | None
    warnings: list[dict[str, Any]]


def verify_record(spec: KernelSpec, case: Case, called: Called, verdict: CheckResult | None,
                  *, budget: dict[str, float], rows_checked: int,
                  sampled_rows: list[int] | None = None, layout: str = "packed",
                  broken: list[str] | None = None, judging: Judging = WIDE_X1) -> VerifyRecord:
    """The record of spec on case: verdict None when the kernel gave nothing to judge (the
    call's error says why); `broken` names contract breaches, which fail the case whatever
    the verdict. What the call raised and warned goes in as it was recorded; judging is the
    contract and budget scale that judged it."""
    if verdict is None:
        verdict = CheckResult(False, called.error or "no output")
    reason = verdict.reason
    if broken:
        reason = "; ".join(broken + ([reason] if reason else []))
    return VerifyRecord(
        kernel=spec.name, function=spec.function, backend=spec.backend, source=spec.source,
        dtype=case.dtype, input=case.generator, seed=case.seed, shape=case.shape,
        params=case.param_dict, rows_checked=rows_checked, sampled_rows=sampled_rows,
        budget=budget, accuracy=judging.accuracy, budget_scale=judging.scale, mode=spec.mode, seconds=called.seconds, layout=layout,
        passed=verdict.passed and not broken, reason=reason, max_ulp=verdict.max_ulp,
        max_budget_frac=verdict.max_budget_frac, special_ok=verdict.special_ok,
        worst=verdict.worst, failures=verdict.failures, raised=called.raised,
        warnings=called.warnings or None,
        env=get_backend(spec.backend).environment() or None)
