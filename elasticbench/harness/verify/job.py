"""The verify command's job: every chosen kernel on every case of the matrix, per mode."""

from __future__ import annotations

from typing import Any

from elasticbench.harness.execute import Isolation
from elasticbench.harness.numerics.truth.cache import TruthStats, TruthStore
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.session import Job, Session
from elasticbench.harness.verify.case import shard_key
from elasticbench.harness.verify.matrix import MAX_ROWS, VerifyCase
from elasticbench.harness.verify.runner import verify_modes


class VerifyJob(Job[tuple[str, VerifyCase]]):
    """Items are (mode, case): each case's reference is computed once for all its kernels."""

    kind = "verify"

    def __init__(self, kernels: dict[str, list[KernelSpec]],
                 cases: dict[str, list[VerifyCase]], *, max_elements: int, store: TruthStore,
                 precision: int, workers: int | None, isolation: Isolation,
                 max_rows: int = MAX_ROWS, scale: float = 1.0, lanes: bool = True):
        self.kernels, self.cases = kernels, cases
        self.max_elements, self.store, self.precision = max_elements, store, precision
        self.workers, self.isolation, self.max_rows = workers, isolation, max_rows
        self.scale = scale  # every budget of the run times this (--budget-scale)
        self.lanes = lanes  # a second kernel lane where it pays (verify/lanes.py)

    def plan(self) -> list[tuple[str, VerifyCase]]:
        return [(m, c) for m, cases in self.cases.items() for c in cases]

    def shard_key(self, item: tuple[str, VerifyCase]) -> Any:
        return shard_key(*item)

    def work(self, items: list[tuple[str, VerifyCase]], session: Session) -> None:
        done = {r.key for r in session.records}
        references = session.task("reference", len(items))
        stats = TruthStats()
        checks = session.task("kernels", sum(
            1 for m, c in items for k in self.kernels[m] if k.function == c.function))
        # every mode in one pass, their batches interleaved (verify/ahead.py)
        verify_modes(
            [k for ks in self.kernels.values() for k in ks],
            {m: [c for mode, c in items if mode == m] for m in self.kernels},
            max_elements=self.max_elements, store=self.store, precision=self.precision,
            workers=self.workers, isolation=self.isolation, done=done,
            on_truth=references.advance, max_rows=self.max_rows, stats=stats,
            scale=self.scale, lanes=self.lanes,
            on_record=lambda r: (session.add(r), checks.advance()))
        session.header["reference"] = stats.to_dict()
