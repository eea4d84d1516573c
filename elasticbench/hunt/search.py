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
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .. import handoff
from ..verify.runner import REFERENCE_PROCESSES, reference_process, result_of
from .space import Config, Space, make_input
from .trial import Input, Judge, Trial, with_truths

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
    folder through which they hand each batch over (elasticbench.handoff)."""

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


def search(space: Space, judge: Judge, rng: np.random.Generator, deadline: float,
           on_trial: Callable[[Trial], None], workers: Ahead,
           max_trials: int | None = None) -> Found | None:
    """Configurations tried until one fails (returned), the deadline (time.monotonic()) passes
    or max_trials were tried (None)."""
    pool: list[tuple[float, int, Config]] = []
    pending: deque[tuple[list[tuple[Config, str]], Future]] = deque()
    sent = tried = 0
    per_trial = 0.0  # seconds the kernel's side spends on a trial, lately

    def send() -> None:
        nonlocal sent
        room = BATCH if max_trials is None else min(BATCH, max_trials - sent)
        queued = sum(len(b) for b, _ in pending)
        if room <= 0 or time.monotonic() + queued * per_trial >= deadline:
            return  # what is queued fills the time left: more would be thrown away
        batch = []
        for _ in range(room):
            fresh = len(pool) < POOL // 2 or rng.random() < EXPLORE
            c = space.random(rng) if fresh else space.mutate(_pick(pool, rng), rng)
            batch.append((c, "explore" if fresh else "mutate"))
        sent += room
        pending.append((batch, workers.pool.submit(
            inputs_with_truths, [c for c, _ in batch], judge.spec.function, judge.spec.mode,
            judge.precision, workers.folder)))

    try:
        for _ in range(workers.depth):
            send()
        while pending and time.monotonic() < deadline:
            batch, future = pending.popleft()
            started = time.perf_counter()
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
        for _, future in pending:
            future.cancel()  # a batch not started is dropped, the others' files removed
            future.add_done_callback(_discard)


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
