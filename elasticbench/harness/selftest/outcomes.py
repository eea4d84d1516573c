"""Running the self-test: each mutant through verification, and the correct kernels too, on
a row matrix (attention's mutants and their run: kinds/attention/mutant_kernels.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from elasticbench.harness.numerics.contract import OWN, Judging
from elasticbench.harness.numerics.truth.cache import TruthStore
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.report.verify_table import describe_case
from elasticbench.harness.selftest.mutants import Mutant
from elasticbench.harness.verify.matrix import VerifyMatrix, expand
from elasticbench.harness.verify.verifier import run_verification


@dataclass
class SelftestOutcome:
    name: str
    bug: str  # "" for a correct kernel
    expected_to_fail: bool
    failed_cases: int
    cases: int
    caught_by: VerifyRecord | None  # the first failing record
    loosest: bool = False  # a mutant judged by the `own` contract at budget scale 4

    @property
    def ok(self) -> bool:
        return (self.failed_cases > 0) == self.expected_to_fail


# The loosest judging a user can state short of a larger scale: every mutant must fail under
# it too (its budgets are at least those of every other contract at scale 1 to 4, so a bug
# caught here is caught under each of them).
LOOSEST = Judging(OWN, 4.0)


def _verify(spec: KernelSpec, matrix: VerifyMatrix, store: TruthStore,
            scale: float = 1.0) -> list[VerifyRecord]:
    records: list[VerifyRecord] = []
    cases = expand(matrix, [spec.function])
    run_verification([spec], cases, max_elements=matrix.max_elements, store=store,
                     on_record=records.append, mode=spec.mode,
                     max_rows=matrix.max_rows, scale=scale)
    return records


def _plan(mutants: tuple[Mutant, ...], correct: list[KernelSpec], loosest: bool
          ) -> list[tuple[KernelSpec, str, bool, float]]:
    """(kernel, bug, expected to fail, budget scale): each mutant as it is, then (loosest)
    judged by the `own` contract at scale 4 (those it allows left out), then the correct
    kernels."""
    plan = [(m.spec, m.bug, True, 1.0) for m in mutants]
    if loosest:
        plan += [(replace(m.spec, name=f"{m.spec.name} ({LOOSEST.describe()})",
                          accuracy=LOOSEST.accuracy), m.bug, True, LOOSEST.scale)
                 for m in mutants if not m.own_allows]
    return plan + [(k, "", False, 1.0) for k in correct]


def run_selftest(
    mutants: tuple[Mutant, ...],
    correct: list[KernelSpec],
    matrix: VerifyMatrix,
    store: TruthStore,
    on_outcome: Callable[[SelftestOutcome], None] = lambda o: None,
    loosest: bool = True,
) -> list[SelftestOutcome]:
    """Verify every mutant (each must fail somewhere, also under the `own` contract at budget
    scale 4 unless loosest=False) and every correct kernel (must pass)."""
    outcomes = []
    for spec, bug, expect_fail, scale in _plan(mutants, correct, loosest):
        records = _verify(spec, matrix, store, scale)
        failed = [r for r in records if r.failed]
        o = SelftestOutcome(spec.name, bug, expect_fail, len(failed), len(records),
                            failed[0] if failed else None, loosest=scale != 1)
        on_outcome(o)
        outcomes.append(o)
    return outcomes


def caught_by_text(o: SelftestOutcome) -> str:
    """The first failing case and the kind of failure, short enough for a table cell."""
    if o.caught_by is None:
        return "-"
    r = o.caught_by
    case = describe_case(r).replace(f" seed={r.seed}", "")
    return f"{case}: {r.reason.split(':')[0]}"
