"""Running a verification: inputs for every case, truths for them, every kernel checked;
the verify command's job (VerifyJob) drives it, per mode."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from elasticbench.harness import handoff
from elasticbench.harness.execute import (
    IN_PROCESS,
    Isolation,
    Outcome,
    call_kernel,
    failed_outcome,
    modified_reason,
)
from elasticbench.harness.numerics.budgets.row_budgets import budget_for
from elasticbench.harness.numerics.contract import Judging
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.numerics.truth.cache import TruthJob, TruthStats, TruthStore, solve
from elasticbench.harness.numerics.truth.row_truth import DEFAULT_PRECISION, GradTruth
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.session import Job, Session
from elasticbench.harness.verify.ahead import SolvedAhead, batches, interleaved
from elasticbench.harness.verify.backward import (
    BackwardOutcome,
    call_backward,
    check_backward,
    grad_budget,
    saved_output,
    upstream,
)
from elasticbench.harness.verify.case import case_key, shard_key
from elasticbench.harness.verify.check import CheckResult, check_output
from elasticbench.harness.verify.compile_check import call_key, compile_checks, with_compile_check
from elasticbench.harness.verify.lanes import lane, lane_share
from elasticbench.harness.verify.matrix import MAX_ROWS, VerifyCase
from elasticbench.harness.verify.record import verify_record
from elasticbench.harness.verify.schedule import judge_batches
from elasticbench.harness.verify.second_order import second_order


def rows_to_check(shape: tuple[int, int], max_elements: int, seed: int,
                  max_rows: int = MAX_ROWS, x: np.ndarray | None = None) -> np.ndarray:
    """All rows when the input is small enough; else a sample of whole rows that always
    holds the first and the last row, then (given the input x) the telling rows (see
    telling_rows), then those on each side of a power of two (where launchers block rows),
    filled up with a seeded draw."""
    rows, n = shape
    if rows * n <= max_elements and rows <= max_rows:
        return np.arange(rows)
    k = max(1, min(max_elements // n, max_rows))
    edges = [rows - 1, 0] + ([] if x is None else telling_rows(x)) + [
        r for j in range(rows.bit_length(), 0, -1) for r in ((1 << j) - 1, 1 << j) if r < rows]
    chosen = list(dict.fromkeys(edges))[:k]
    rest = np.setdiff1d(np.arange(rows), chosen)
    rng = np.random.default_rng([seed, rows, n])
    fill = rng.choice(rest, size=min(k - len(chosen), len(rest)), replace=False)
    return np.sort(np.concatenate([np.asarray(chosen, dtype=np.int64), fill]))


def telling_rows(x: np.ndarray) -> list[int]:
    """Rows a sample must not leave out: the first and the last row holding a NaN, a +inf,
    a -inf, the largest finite value and the smallest (a kernel that mishandles a special
    value on some rows only, say past a launch boundary, fails on one of them)."""
    x64 = np.asarray(x, dtype=np.float64)  # no copy when x is already float64
    with np.errstate(invalid="ignore"):  # a row of NaN only: NaN, never a hit below
        top, bottom = np.fmax.reduce(x64, axis=1), np.fmin.reduce(x64, axis=1)
    marks = [np.isnan(x64).any(axis=1), top == np.inf, bottom == -np.inf]
    if marks[1].any() or marks[2].any():  # each row's finite extremes: pass again
        finite = np.isfinite(x64)
        top = np.where(finite, x64, -np.inf).max(axis=1)
        bottom = np.where(finite, x64, np.inf).min(axis=1)
    if np.isfinite(top).any():
        marks += [top == np.nanmax(np.where(np.isfinite(top), top, np.nan)),
                  bottom == np.nanmin(np.where(np.isfinite(bottom), bottom, np.nan))]
    out: list[int] = []
    for mark in marks:
        hit = np.flatnonzero(mark)
        if hit.size:
            out += [int(hit[0]), int(hit[-1])]
    return out


@dataclass
class Prepared:
    case: VerifyCase
    x: np.ndarray | None  # None in what a hunt's reference process sends back
    job: TruthJob | None  # None once solved: the reference process sends no input copies back
    g: np.ndarray | None = None  # upstream gradient (backward verification)
    mode: str = "fwd"


def prepare(cases: list[VerifyCase], max_elements: int, precision: int,
            mode: str = "fwd", max_rows: int = MAX_ROWS) -> list[Prepared]:
    return [prepare_input(case, case.input(), max_elements, precision, mode, max_rows)
            for case in cases]


def prepare_input(case: VerifyCase, x: np.ndarray, max_elements: int, precision: int,
                  mode: str = "fwd", max_rows: int = MAX_ROWS) -> Prepared:
    """A case with its input x: the rows to check, the question for the reference and, for
    a backward case, the upstream gradient."""
    x64 = x.astype(np.float64)
    rows = rows_to_check(case.shape, max_elements, case.seed, max_rows, x64)
    g = None
    if mode == "bwd":
        g = upstream(case.seed, case.generator, get_format(case.dtype), case.shape, rows)
    job = TruthJob(case.function, case.params, case.dtype, x64, rows,
                   precision, None if g is None else g.astype(np.float64))
    return Prepared(case, x, job, g, mode)


def _record(spec: KernelSpec, case: VerifyCase, truth, budget: dict, judging: Judging,
            outcome: Outcome | BackwardOutcome, verdict: CheckResult | None,
            broken: list[str] | None = None) -> VerifyRecord:
    """verify_record with what rows add: the rows checked (a sample of them) and the layout."""
    sampled = truth.rows.tolist() if len(truth.rows) < case.shape[0] else None
    return verify_record(spec, case, outcome, verdict, budget=budget, judging=judging,
                         rows_checked=len(truth.rows), sampled_rows=sampled,
                         layout=case.layout, broken=broken)


def verify_one(spec: KernelSpec, prep: Prepared, truth,
               isolation: Isolation = IN_PROCESS, scale: float = 1.0) -> VerifyRecord:
    """Run one kernel on one case and return its record (budgets of its contract, times
    scale)."""
    case = prep.case
    fmt = get_format(case.dtype)
    judging = Judging(spec.accuracy, scale)
    budget = budget_for(fmt, spec.accuracy)
    outcome = isolation.run(partial(call_kernel, spec, prep.x, case.param_dict, case.layout),
                            failed_outcome)
    if outcome.output is None:
        return _record(spec, case, truth, budget.to_dict(), judging, outcome, None)
    v = check_output(prep.x, outcome.output, truth, fmt, budget.scaled(scale))
    broken = [msg for bad, msg in (
        (outcome.modified_input, modified_reason(outcome.modified_args or ["x"])),
        (outcome.wrote_outside, "wrote outside its input (row padding or the memory before "
                                "a view)"),
        (outcome.returned_input, "returned its input")) if bad]
    return _record(spec, case, truth, budget.to_dict(), judging, outcome, v, broken=broken)


def verify_backward_one(spec: KernelSpec, prep: Prepared, truth: GradTruth,
                        isolation: Isolation = IN_PROCESS, scale: float = 1.0) -> VerifyRecord:
    """Run one backward kernel on one case: dx in ulps, parameter gradients relatively
    (budgets of its contract, times scale)."""
    case = prep.case
    fmt = get_format(case.dtype)
    assert prep.g is not None
    # the same for every kernel: each call gets a fresh copy of it (call_backward)
    y = truth.derived(("saved_output", fmt.name), lambda: saved_output(truth, fmt, prep.x))
    outcome = isolation.run(partial(call_backward, spec, prep.x, y, prep.g, case.param_dict,
                                    case.layout),
                            lambda why, s: BackwardOutcome(None, {}, why, False, s))
    judging = Judging(spec.accuracy, scale)
    gb = grad_budget(judging)
    budget = gb.to_dict()
    if outcome.dx is None:
        record = _record(spec, case, truth, budget, judging, outcome, None)
        record.dparams = {}
        return record
    v, checks = check_backward(prep.x, prep.g, outcome.dx, outcome.dparams, truth, fmt,
                               case.function, case.param_dict, gb)
    record = _record(spec, case, truth, budget, judging, outcome, v,
                     broken=[modified_reason(outcome.modified_args or ["x"])]
                     if outcome.modified_input else None)
    record.dparams = {k: c.to_dict() for k, c in checks.items()}
    rels = [c.rel_err for c in checks.values()]
    record.max_param_rel = max(rels) if rels else None
    record.second_order = second_order(spec, isolation)
    return record


def run_verification(kernels: list[KernelSpec], cases: list[VerifyCase], *,
                     mode: str = "fwd", **options: Any) -> None:
    """Verify each kernel (all of `mode`) on every case of its function that it takes
    (verify_modes, for one mode)."""
    verify_modes(kernels, {mode: cases}, **options)


def verify_modes(
    kernels: list[KernelSpec],
    cases: dict[str, list[VerifyCase]],
    *,
    max_elements: int,
    store: TruthStore,
    precision: int = DEFAULT_PRECISION,
    workers: int | None = None,
    on_record: Callable[[VerifyRecord], None] = lambda r: None,
    on_truth: Callable[[int], None] | None = None,
    isolation: Isolation = IN_PROCESS,
    done: frozenset[tuple] | set[tuple] = frozenset(),
    max_rows: int = MAX_ROWS,
    stats: TruthStats | None = None,
    scale: float = 1.0,
    lanes: bool = False,
) -> None:
    """Verify each kernel on every case of its mode (cases: mode -> its cases) and function
    that it takes, the modes' batches interleaved (verify/ahead.py); pairs whose record_key
    is in `done` (a resumed run) are skipped, and a case left with nothing to do costs no
    reference. Each record goes to on_record; how the truths were obtained is added to
    stats. Budgets are each kernel's contract's, times scale. lanes: a share of the kernels
    may be judged by a second process beside this one (verify/lanes.py); its records come
    after this one's for each batch."""
    todo = _planned(kernels, done)
    cases = {m: [c for c in cs if todo(m, c)] for m, cs in cases.items()}
    planned = [(spec, case) for m, cs in cases.items() for case in cs for spec in todo(m, case)]
    compiled = compile_checks(planned)
    solve_batch = partial(solved, max_elements=max_elements, precision=precision,
                          max_rows=max_rows, store=store, workers=workers)
    stats = stats if stats is not None else TruthStats()
    pairs = Counter((spec.name, spec.mode) for spec, _ in planned)
    shared = None if not lanes or isolation.active else lane_share(
        kernels, lambda k: pairs[(k.name, k.mode)])
    work = interleaved({m: batches(cs, max_elements) for m, cs in cases.items() if cs})

    def emit(spec: KernelSpec, case: VerifyCase, record: VerifyRecord) -> None:
        with_compile_check(record, compiled.get(call_key(spec, case)))
        on_record(record)

    def judge(prep: Prepared, truth: Any, specs: list[KernelSpec]) -> None:
        for spec in specs:
            emit(spec, prep.case, judge_one(spec, prep, truth, isolation, scale))

    # on an error or an interrupt the reference processes (and the lane) end at once
    with handoff.folder() as where, lane(judge_one, scale, where) as second, SolvedAhead(
            work, solve_batch, stats, where, keep=shared is not None) as ahead:
        judge_batches(ahead, second, todo, shared, judge, emit, on_truth)


def judge_one(spec: KernelSpec, prep: Prepared, truth: Any,
              isolation: Isolation = IN_PROCESS, scale: float = 1.0) -> VerifyRecord:
    """verify_one or verify_backward_one, by the kernel's mode."""
    one = verify_backward_one if spec.mode == "bwd" else verify_one
    return one(spec, prep, truth, isolation, scale)


def _planned(kernels: list[KernelSpec], done: frozenset[tuple] | set[tuple]
             ) -> Callable[[str, VerifyCase], list[KernelSpec]]:
    """The kernels still to judge on a case of a mode: of that mode and the case's function,
    taking its dtype and layout, not done already (a resumed run)."""
    by_function: dict[tuple[str, str], list[KernelSpec]] = {}
    for k in kernels:
        by_function.setdefault((k.mode, k.function), []).append(k)

    def todo(mode: str, case: VerifyCase) -> list[KernelSpec]:
        return [k for k in by_function.get((mode, case.function), ())
                if k.supports(case.dtype) and k.takes_layout(case.layout)
                and case_key(k, case) not in done]

    return todo


def solved(mode: str, batch: list[VerifyCase], *, max_elements: int, precision: int,
           max_rows: int, store: TruthStore, workers: int | None
           ) -> tuple[list[Prepared], list, TruthStats]:
    """The batch's inputs with their truths, and how the truths were obtained (what the
    reference process computes; the jobs are dropped, not sent back)."""
    stats = TruthStats()
    prepared = prepare(batch, max_elements, precision, mode, max_rows)
    truths = solve([p.job for p in prepared], store, workers, None, stats)  # type: ignore[misc]
    return [replace(p, job=None) for p in prepared], truths, stats


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
