"""One trial of a hunt: a kernel on one input, judged exactly as `verify` judges a case.

A trial is a verify case whose input the hunt made (not a generator's): it goes through the
same preparation, reference and check, and becomes the same kind of record. Rows are checked
as a case file replays them (seed 0 and the hunt's limits below), so a saved reproducer
is judged again exactly as the trial was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from elasticbench.harness.execute import IN_PROCESS, Isolation
from elasticbench.harness.numerics.truth.cache import TruthStats, TruthStore, solve
from elasticbench.harness.numerics.truth.row_truth import DEFAULT_PRECISION
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.verify.matrix import VerifyCase
from elasticbench.harness.verify.verifier import (
    Prepared,
    prepare_input,
    verify_backward_one,
    verify_one,
)

MAX_CHECKED = 8192  # elements of the reference per trial (a sample of whole rows beyond)
MAX_CHECKED_ROWS = 64
SEED = 0  # the seed every trial's rows (and upstream gradient) are drawn with


@dataclass(frozen=True)
class Input:
    """What a trial feeds the kernel: the values, their name in the records, the layout and
    the parameters."""

    name: str
    x: np.ndarray
    layout: str
    params: tuple[tuple[str, float], ...]

    @property
    def elements(self) -> int:
        return int(self.x.size)


@dataclass
class Trial:
    record: VerifyRecord

    @property
    def failed(self) -> bool:
        return not self.record.passed

    @property
    def fraction(self) -> float:
        """The share of the error budget used: what the search climbs (inf once failed)."""
        if self.failed:
            return float("inf")
        frac = self.record.max_budget_frac
        return float(frac) if frac is not None else 0.0

    @property
    def failure(self) -> str | None:
        """The kind of failure ('accuracy', 'special', 'raised ValueError', ...): shrinking
        keeps it, so that a reproducer shows the bug that was found and not another."""
        if not self.failed:
            return None
        if self.record.special_ok is False:
            return "special"
        head = (self.record.reason or "").split(";")[0].split(":")[0]
        return re.sub(r"\s*[\d(\[].*$", "", head).strip() or "failed"


class Judge:
    """Runs trials of one kernel (forward or backward) and numbers them."""

    def __init__(self, spec: KernelSpec, *, precision: int = DEFAULT_PRECISION,
                 isolation: Isolation = IN_PROCESS, stats: TruthStats | None = None):
        self.spec, self.precision, self.isolation = spec, precision, isolation
        self.stats = stats if stats is not None else TruthStats()  # how truths were obtained
        self.count = 0

    def __call__(self, inp: Input, dtype: str, phase: str,
                 extra: dict[str, Any] | None = None) -> Trial:
        """One trial, its reference computed here (the shrinker's: one input at a time)."""
        ((prep, truth),), stats = with_truths([inp], [dtype], self.spec.function,
                                              self.spec.mode, self.precision)
        self.stats.add(stats)
        return self.score(prep, truth, phase, extra)

    def score(self, prep: Prepared, truth: Any, phase: str,
              extra: dict[str, Any] | None = None) -> Trial:
        """The kernel run on a prepared input and judged against its truth: the next trial."""
        one = verify_backward_one if self.spec.mode == "bwd" else verify_one
        self.count += 1
        record = one(self.spec, prep, truth, self.isolation)
        return Trial(replace(record, hunt={"trial": self.count, "phase": phase, **(extra or {})}))


def with_truths(inputs: list[Input], dtypes: list[str], function: str, mode: str,
                precision: int) -> tuple[list[tuple[Prepared, Any]], TruthStats]:
    """Each input prepared as a verify case of `function` (rows to check, upstream gradient)
    with its truth, and how the truths were obtained: what a reference process computes for
    a batch of trials (the question itself is not sent back)."""
    stats = TruthStats()
    preps = [prepare_input(VerifyCase(function, inp.name, (int(inp.x.shape[0]),
                                                           int(inp.x.shape[1])),
                                      dtype, inp.params, SEED, inp.layout),
                           inp.x, MAX_CHECKED, precision, mode, MAX_CHECKED_ROWS)
             for inp, dtype in zip(inputs, dtypes, strict=True)]
    truths = solve([p.job for p in preps], TruthStore(None), workers=1,  # type: ignore[misc]
                   stats=stats)
    return [(replace(p, job=None), t) for p, t in zip(preps, truths, strict=True)], stats
