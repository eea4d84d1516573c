"""The hunt as a results-session job: each kernel searched in turn within its share of the
time budget; a failure shrunk and saved as a case file; every trial a record."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elasticbench.harness.backends import get_backend
from elasticbench.harness.execute import IN_PROCESS, Isolation
from elasticbench.harness.hunt.reproducer import save_case
from elasticbench.harness.hunt.search import Ahead, Found, Queue, ahead, config_input, search
from elasticbench.harness.hunt.shrink import Shrinker, Shrunk
from elasticbench.harness.hunt.space import MAX_ELEMENTS, Space
from elasticbench.harness.hunt.trial import Judge, Trial
from elasticbench.harness.numerics.truth.cache import TruthStats
from elasticbench.harness.numerics.truth.row_truth import DEFAULT_PRECISION
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.session import Job, Session

MIN_SHRINK_S = 20.0  # shrinking a failure may run this long past the search's budget


@dataclass
class Hunted:
    """What hunting one kernel came to."""

    spec: KernelSpec
    trials: int = 0
    best_fraction: float = 0.0  # the largest share of its budget a passing trial used
    found: Found | None = None
    shrunk: Shrunk | None = None
    case_path: Path | None = None
    seconds: float = 0.0
    kernel_s: float = 0.0  # of seconds, in the kernel's own calls (compiling included)
    found_s: float | None = None  # of seconds, those before the failure was found

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kernel": self.spec.name, "mode": self.spec.mode,
                               "trials": self.trials, "best_budget_frac": self.best_fraction,
                               "seconds": self.seconds, "kernel_s": self.kernel_s,
                               "failed": self.found is not None,
                               "untried": self.found is None and not self.trials}
        if self.found is not None:
            first = self.found.trial.record
            out["first"] = {"shape": list(first.shape), "elements": first.shape[0]
                            * first.shape[1], "reason": first.reason,
                            "seconds": self.found_s}
        if self.shrunk is not None:
            last = self.shrunk.trial.record
            out["shrunk"] = {"shape": list(last.shape), "elements": self.shrunk.input.elements,
                             "steps": self.shrunk.steps, "reason": last.reason,
                             "case": str(self.case_path)}
        return out


@dataclass
class HuntJob(Job[KernelSpec]):
    kernels: list[KernelSpec]
    dtypes: list[str]
    budget: float  # seconds of search for all kernels together
    seed: int
    case_stem: Path  # reproducers go to <stem>.<kernel>.toml
    precision: int = DEFAULT_PRECISION
    isolation: Isolation = IN_PROCESS
    max_trials: int | None = None  # per kernel, besides the budget (tests)
    max_shrink: int | None = None  # shrinking trials at most (tests)
    max_elements: int = MAX_ELEMENTS  # of one configuration
    replay: Callable[[KernelSpec, Path], str] = lambda spec, path: ""  # the command to rerun
    results: list[Hunted] = field(default_factory=list)
    stats: TruthStats = field(default_factory=TruthStats)  # the reference, every kernel's trials

    kind = "verify"

    def plan(self) -> list[KernelSpec]:
        return list(self.kernels)

    def shard_key(self, item: KernelSpec) -> Any:
        return [item.name, item.mode]

    def work(self, items: list[KernelSpec], session: Session) -> None:
        started = time.monotonic()
        bar = session.task("hunt", self.budget)
        shown = [0.0]

        def tick() -> None:
            now = min(self.budget, time.monotonic() - started)
            bar.advance(now - shown[0])
            shown[0] = now

        with ahead() as workers:
            queues = [self._queue(spec, workers) for spec in items]
            try:
                for i, spec in enumerate(items):
                    share = (self.budget - (time.monotonic() - started)) / (len(items) - i)
                    hunted = Hunted(spec)
                    self.results.append(hunted)
                    # the next kernel's first batches go to the reference processes once
                    # this one's queue fills its time: its search starts on ready truths
                    following = queues[i + 1] if i + 1 < len(queues) else None
                    after = following.start if following is not None else (lambda: None)
                    try:
                        self._hunt(spec, hunted, session, time.monotonic() + max(share, 0.0),
                                   queues[i], after, bar, tick)
                    finally:  # the header says what each kernel came to, interrupted or not
                        session.header.setdefault("hunt", {})["kernels"] = [
                            h.summary() for h in self.results]
                        session.header["reference"] = self.stats.to_dict()
            finally:
                for q in queues:
                    if q is not None:
                        q.drop()
        tick()

    def _queue(self, spec: KernelSpec, workers: Ahead) -> Queue | None:
        """The kernel's search queue (None: it takes none of the dtypes)."""
        dtypes = [d for d in self.dtypes if spec.supports(d)]
        if not dtypes:
            return None
        layouts = list(get_backend(spec.backend).layouts)
        return Queue(Space(spec.function, dtypes, layouts, self.max_elements),
                     np.random.default_rng([self.seed, *spec.name.encode()]), spec.function,
                     spec.mode, self.precision, workers, self.max_trials)

    def _hunt(self, spec: KernelSpec, hunted: Hunted, session: Session, deadline: float,
              queue: Queue | None, after: Callable[[], None], bar: Any,
              tick: Callable[[], None]) -> None:
        start = time.monotonic()
        judge = Judge(spec, precision=self.precision, isolation=self.isolation,
                      stats=self.stats)

        def keep(trial: Trial) -> None:
            session.add(trial.record)
            hunted.trials += 1
            hunted.kernel_s += trial.record.seconds or 0.0
            if not trial.failed:
                hunted.best_fraction = max(hunted.best_fraction, trial.fraction)
            bar.describe(f"hunt {spec.name}: {hunted.trials} tried, "
                         f"{hunted.best_fraction:.0%} of budget at most")
            tick()

        if queue is not None:
            hunted.found = search(queue, judge, deadline, keep, after)
        else:
            after()
        if hunted.found is not None:
            hunted.found_s = time.monotonic() - start
            self._shrink(spec, hunted, judge, keep, deadline)
        hunted.seconds = time.monotonic() - start

    def _shrink(self, spec: KernelSpec, hunted: Hunted, judge: Judge,
                keep: Callable[[Trial], None], deadline: float) -> None:
        assert hunted.found is not None
        found = hunted.found
        dtype = found.config.dtype
        path = self.case_stem.with_name(f"{self.case_stem.name}.{spec.name}.toml")
        start = config_input(found.config)
        first = found.trial.record
        note = [f"Found by `elasticbench hunt` on {spec.name} ({spec.mode}): {first.reason}",
                f"first failing trial: {found.config.label()} {first.shape[0]}x"
                f"{first.shape[1]} {found.config.layout} {dtype} {dict(found.config.params)}"]
        save_case(path, start, spec.function, dtype, [*note, "not shrunk yet"])
        hunted.case_path = path

        def trial(inp, phase):
            t = judge(inp, dtype, phase)
            keep(t)
            return t

        until = max(deadline, time.monotonic() + max(MIN_SHRINK_S, self.budget / 4))
        shrinker = Shrinker(trial, dtype, spec.function, start, found.trial, until,
                            self.max_shrink)
        hunted.shrunk = shrinker.run()
        done = hunted.shrunk
        note.append(f"shrunk in {done.steps} trials from {start.elements} elements to "
                    f"{done.input.elements}: {done.trial.record.reason}")
        replay = self.replay(spec, path)
        if replay:
            note.append(f"replay: {replay}")
        save_case(path, done.input, spec.function, dtype, note)
