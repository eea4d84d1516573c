"""The record of one kernel checked on one case by `verify`: the case, then the verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from elasticbench.harness.records.fields import duration_s, entry, nonnegative, positive
from elasticbench.harness.records.identity import KernelCase


@dataclass(kw_only=True)
class VerifyRecord(KernelCase):
    """One kernel on one case: scored in ulps (dx backward, with the parameter gradients)."""

    input: str
    seed: int
    rows_checked: int | None = entry(None, check=nonnegative)
    sampled_rows: list[int] | None = entry(None, check=nonnegative)  # None: every row
    budget: dict[str, float] | None = None  # the coefficients of the contract's budget
    accuracy: Literal["wide", "own"] = "wide"  # the contract that judged it (older files: wide)
    budget_scale: float = entry(1.0, check=positive)  # allowance = scale x budget (older: 1)
    # attention: the causal convention that judged it (None: rows; older attention files
    # were judged top-left)
    causal: Literal["top_left", "bottom_right"] | None = None
    seconds: float | None = entry(None, check=duration_s)
    passed: bool
    reason: str | None = None  # why it failed ("" or None when it passed)
    max_ulp: float | None = entry(None, nonfinite=True)
    max_budget_frac: float | None = entry(None, nonfinite=True)
    special_ok: bool | None = None  # None: the kernel gave no output to judge
    worst: dict[str, Any] | None = None  # where the largest share of the budget was used
    failures: dict[str, int] = entry(factory=dict, check=nonnegative)  # kind -> positions
    dparams: dict[str, dict[str, Any]] | None = None  # backward: per-parameter checks
    max_param_rel: float | None = entry(None, nonfinite=True)
    second_order: str | None = None  # backward: "yes", "no", "wrong" (verify/second_order.py)
    compile: dict[str, Any] | None = None  # what compiling the call said, where checked
    raised: dict[str, Any] | None = None  # the exception the kernel raised (execute.py)
    warnings: list[dict[str, Any]] | None = None  # what the kernel warned, counted
    env: dict[str, str] | None = None  # environment its backend read (reproduce sets it)
    layout: str = "packed"  # how the input lay in memory (inputs/layouts.py)
    hunt: dict[str, Any] | None = None  # a hunt's trial: its number, phase, configuration

    @property
    def generated_by(self) -> str | None:
        return self.input

    @property
    def failed(self) -> bool:
        return not self.passed
