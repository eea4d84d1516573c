"""The search: random exploration, plus small changes to the configurations that came
closest to failing (the largest share of their error budget), until one fails or time is up.

An evolutionary search of the simplest kind: a pool of the best configurations so far;
each step either draws a fresh configuration or changes one picked from the pool by a
tournament. Drawing fresh keeps it from settling on one corner; changing the best climbs
toward a kernel's weak spot (a band of tau where its error grows, a length where it starts
to lose accuracy) that a fresh draw hits only by luck.

Configurations are judged in batches: a batch's inputs and references are made in a
reference process while the kernel runs on the batch before, so that the two take a core
each. A batch is drawn from the pool as it stands when the batch is sent, a few trials
behind the newest; the same seed still retraces the same configurations.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, wait
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from elasticbench.harness import handoff
from elasticbench.harness.hunt.space import Config, Space, make_input
from elasticbench.harness.hunt.trial import Input, Judge, Trial, with_truths
from elasticbench.harness.verify.ahead import REFERENCE_PROCESSES, reference_process, result_of

POOL = 16
EXPLORE = 0.35  # chance of a fresh draw once the pool is full
BATCH = 8  # configurations whose inputs and references are made together
DEPTH = 2  # batches queued per reference process: a large configuration does not stall the kernel


@dataclass
class Found:
    config: Config
    trial: Trial


@dataclass(frozen=True)
class Ahead:
    """Where batches are prepared: reference processes, as many batches at a time, and the
    folder through which they hand each batch over (elasticbench.harness.handoff)."""

    pool: Executor
    depth: int
    folder: Path


@contextmanager
def ahead(processes: int = REFERENCE_PROCESSES) -> Iterator[Ahead]:
    """Reference processes and their hand-over folder (in memory where Linux has it), both
    gone on leaving, whatever the way out."""
    with handoff.folder("elasticbench-hunt-") as where, reference_process(processes) as pool:
        yield Ahead(pool, DEPTH * processes, where)


def config_input(c: Config) -> Input:
    return Input(c.label(), make_input(c), c.layout, c.params)


@dataclass
class Queue:
    """A kernel's batches of configurations in the reference processes, oldest first, and
    the pool the next ones are drawn from: the search's state, which can start (its first
    batches sent, all fresh draws) while the kernel before it is still being searched."""

    space: Space
    rng: np.random.Generator
    function: str
    mode: str
    precision: int
    workers: Ahead
    max_trials: int | None = None
    pool: list[tuple[float, int, Config]] = field(default_factory=list)
    pending: deque[tuple[list[tuple[Config, str]], Future]] = field(default_factory=deque)
    sent: int = 0
    started: bool = False

    def send(self) -> None:
        """One batch more drawn (from the pool as it stands) and sent."""
        room = BATCH if self.max_trials is None else min(BATCH, self.max_trials - self.sent)
        if room <= 0:
            return
        batch = []
        for _ in range(room):
            fresh = len(self.pool) < POOL // 2 or self.rng.random() < EXPLORE
            c = None if fresh else self.space.mutate(_pick(self.pool, self.rng), self.rng)
            if c is None:  # a fresh draw, or a change whose size was turned away
                batch.append((self.space.random(self.rng), "explore"))
            else:
                batch.append((c, "mutate"))
        self.sent += room
        self.pending.append((batch, self.workers.pool.submit(
            inputs_with_truths, [c for c, _ in batch], self.function, self.mode,
            self.precision, self.workers.folder)))

    def start(self) -> None:
        """The first batches sent, once: as many as the reference processes queue."""
        if not self.started:
            self.started = True
            for _ in range(self.workers.depth):
                self.send()

    def drop(self) -> None:
        """Batches not judged: cancelled if not started, else their files removed."""
        for _, future in self.pending:
            future.cancel()
            future.add_done_callback(_discard)
        self.pending.clear()


def _nothing() -> None:
    pass


def search(queue: Queue, judge: Judge, deadline: float, on_trial: Callable[[Trial], None],
           then: Callable[[], None] = _nothing) -> Found | None:
    """Configurations tried until one fails (returned), the deadline (time.monotonic()) passes
    or the queue's max_trials were tried (None). then: called once, when what is queued
    fills the time left (the next kernel's queue can start then)."""
    pool = queue.pool
    tried = 0
    per_trial = 0.0  # seconds the kernel's side spends on a trial, lately

    def send() -> None:
        nonlocal then
        queued = sum(len(b) for b, _ in queue.pending)
        if time.monotonic() + queued * per_trial >= deadline:  # more would be thrown away
            then()
            then = _nothing
            return
        queue.send()

    try:
        queue.start()
        while queue.pending and time.monotonic() < deadline:
            batch, future = queue.pending[0]
            started = time.perf_counter()
            # truths that come past the deadline (rows left to mpmath can take seconds) are
            # not waited for: the kernels after this one keep their shares of the budget
            if not wait([future], timeout=deadline - time.monotonic()).done:
                judge.stats.wait_s += time.perf_counter() - started
                return None  # the batch stays queued, so drop() discards it
            queue.pending.popleft()
            prepared, stats = result_of(future, f"hunt configuration {batch[0][0].label()}")
            stats.wait_s += time.perf_counter() - started
            judge.stats.add(stats)
            send()  # drawn before this batch is judged: the reference process keeps busy
            judged = time.perf_counter()
            for (c, phase), (p, truth) in zip(batch, prepared, strict=True):
                if time.monotonic() >= deadline:
                    return None
                trial = judge.score(p, truth, phase, {"config": _config_dict(c)})
                tried += 1
                on_trial(trial)
                if trial.failed:
                    return Found(c, trial)
                pool.append((trial.fraction, tried, c))
                pool.sort(key=lambda t: (-t[0], t[1]))
                del pool[POOL:]
            took = (time.perf_counter() - judged) / len(batch)
            per_trial = took if not per_trial else 0.7 * per_trial + 0.3 * took
        return None
    finally:
        queue.drop()


def inputs_with_truths(configs: list[Config], function: str, mode: str, precision: int,
                       where: Path) -> bytes:
    """A batch's inputs, prepared, with their truths and how they were obtained, packed for
    the parent (handoff: the arrays go as files in `where`); what a reference process
    computes."""
    inputs = [config_input(c) for c in configs]
    prepared, stats = with_truths(inputs, [c.dtype for c in configs], function, mode,
                                  precision)
    return handoff.pack((prepared, stats), where)


def _discard(future: Future) -> None:
    if not future.cancelled() and future.exception() is None:
        handoff.discard(future.result())


def _pick(pool: list[tuple[float, int, Config]], rng: np.random.Generator) -> Config:
    """The best of three drawn from the pool."""
    picks = rng.choice(len(pool), size=min(3, len(pool)), replace=False)
    return pool[int(min(picks))][2]


def _config_dict(c: Config) -> dict:
    d = asdict(c)
    d["params"] = dict(c.params)
    d["spikes"] = [list(s) for s in c.spikes]
    return d
