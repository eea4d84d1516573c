"""Running the self-test: each mutant through verification, and the correct kernels too."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..numerics.truth_cache import TruthStore
from ..registry import KernelSpec
from ..report.verify_table import describe_case
from ..verify.matrix import VerifyMatrix, expand
from ..verify.runner import run_verification
from .mutants import Mutant


@dataclass
class SelftestOutcome:
    name: str
    bug: str  # "" for a correct kernel
    expected_to_fail: bool
    failed_cases: int
    cases: int
    caught_by: dict[str, Any] | None  # the first failing record

    @property
    def ok(self) -> bool:
        return (self.failed_cases > 0) == self.expected_to_fail


def _verify(spec: KernelSpec, matrix: VerifyMatrix, store: TruthStore) -> list[dict]:
    records: list[dict] = []
    cases = expand(matrix, [spec.function])
    run_verification([spec], cases, max_elements=matrix.max_elements, store=store,
                     on_record=lambda r: records.append(r.to_dict()), mode=spec.mode,
                     max_rows=matrix.max_rows)
    return records


def run_selftest(
    mutants: tuple[Mutant, ...],
    correct: list[KernelSpec],
    matrix: VerifyMatrix,
    store: TruthStore,
    on_outcome: Callable[[SelftestOutcome], None] = lambda o: None,
) -> list[SelftestOutcome]:
    """Verify every mutant (each must fail somewhere) and every correct kernel (must pass)."""
    plan = [(m.spec, m.bug, True) for m in mutants] + [(k, "", False) for k in correct]
    outcomes = []
    for spec, bug, expect_fail in plan:
        records = _verify(spec, matrix, store)
        failed = [r for r in records if not r["passed"]]
        o = SelftestOutcome(spec.name, bug, expect_fail, len(failed), len(records),
                    failed[0] if failed else None)
        on_outcome(o)
        outcomes.append(o)
    return outcomes


def caught_by_text(o: SelftestOutcome) -> str:
    """The first failing case and the kind of failure, short enough for a table cell."""
    if o.caught_by is None:
        return "-"
    r = o.caught_by
    case = describe_case(r).replace(f" seed={r['seed']}", "")
    return f"{case}: {r['reason'].split(':')[0]}"
