"""The reference side of a verification: its cases in batches, each batch's inputs and truths
made in reference processes ahead of the kernels, and handed over through files.

Batches of the two modes are interleaved in proportion (`interleaved`), so that the
backward's reference, the costlier one, is computed while the forward's kernels run, not
after them (docs/numerics.md section 6.9).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from elasticbench import native
from elasticbench.harness import handoff
from elasticbench.harness.numerics.certified import native_sweeps
from elasticbench.harness.numerics.truth.cache import TruthError, TruthStats
from elasticbench.harness.verify.matrix import VerifyCase

BATCH_ELEMENTS = 1 << 22  # checked elements of the cases prepared and solved together
RAMP = 3  # batches before the first full one, each twice the one before
# batches whose references are computed at once, a process each, beside the kernels: with
# light kernels (numpy, cpp) the reference is the longer of the two
REFERENCE_PROCESSES = max(1, min(2, os.cpu_count() or 1))

Batch = tuple[str, list[VerifyCase]]  # (mode, its cases)


def batches(cases: list[VerifyCase], max_elements: int,
            limit: int = BATCH_ELEMENTS) -> list[list[VerifyCase]]:
    """Consecutive runs of cases whose checked elements add up to about `limit`, the first
    RAMP of them to 1/2^RAMP, ..., 1/2 of it: the kernels wait for the first truth alone."""
    out: list[list[VerifyCase]] = [[]]
    size = 0
    for case in cases:
        rows, n = case.shape
        elements = min(rows * n, max(max_elements, n))
        if out[-1] and size + elements > limit >> max(0, RAMP + 1 - len(out)):
            out.append([])
            size = 0
        out[-1].append(case)
        size += elements
    return [b for b in out if b]


def interleaved(work: dict[str, list[list[VerifyCase]]]) -> list[Batch]:
    """Every mode's batches, in order within each mode, merged so that each mode is as far
    through its own batches as the others are through theirs."""
    out: list[Batch] = []
    taken = dict.fromkeys(work, 0)
    total = sum(len(b) for b in work.values())
    while len(out) < total:
        mode = min((m for m in work if taken[m] < len(work[m])),
                   key=lambda m: (taken[m] + 0.5) / len(work[m]))
        out.append((mode, work[mode][taken[mode]]))
        taken[mode] += 1
    return out


class SolvedAhead:
    """Each batch's prepared inputs and truths (solve_batch's first two items), in order,
    handed over through files in `where`; how they were obtained, and how long the caller
    waited for them, added to stats. keep: each batch's files are left for one more reader,
    to whom the third item of take() (the packed batch) goes; else it is None. A context
    manager: the reference processes end on leaving (at once on an error or an interrupt).

    A batch at a time per process, so that the inputs and truths of the whole matrix never
    sit in memory at once; the next batches' references are computed in processes of their
    own while the caller judges this one (a thread would share the interpreter lock with
    torch.compile's tracing, and the two would take turns instead of running side by side)."""

    def __init__(self, work: list[Batch], solve_batch: Callable[[str, list[VerifyCase]], Any],
                 stats: TruthStats, where: Path, keep: bool = False) -> None:
        self.work, self.stats, self.keep = work, stats, keep
        self.handed = partial(_handed, solve_batch, where)
        self.depth = min(REFERENCE_PROCESSES, len(work))
        self.taken = 0
        self.pending: deque[Future] = deque()
        self._processes = reference_process(self.depth)

    def __enter__(self) -> SolvedAhead:
        self.pool = self._processes.__enter__()
        self.pending.extend(self.pool.submit(self.handed, *b) for b in self.work[:self.depth])
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        return self._processes.__exit__(*exc)

    def left(self) -> bool:
        """Whether a batch is still to be taken."""
        return self.taken < len(self.work)

    def ready(self) -> bool:
        """Whether take() answers without waiting."""
        return self.left() and self.pending[0].done()

    def take(self) -> tuple[Any, Any, bytes | None]:
        """The next batch: (prepared, truths, packed batch or None), waiting for it."""
        i = self.taken
        started = time.perf_counter()
        future = self.pending.popleft()
        prepared, truths, batch_stats = result_of(future, _named(self.work[i][1]), self.keep)
        self.stats.wait_s += time.perf_counter() - started
        self.taken += 1
        if i + self.depth < len(self.work):
            self.pending.append(self.pool.submit(self.handed, *self.work[i + self.depth]))
        self.stats.add(batch_stats)
        return prepared, truths, future.result() if self.keep else None


def _handed(solve_batch: Callable[[str, list[VerifyCase]], Any], where: Path, mode: str,
            batch: list[VerifyCase]) -> bytes:
    """solve_batch's result packed for the parent, its arrays as files in `where`."""
    return handoff.pack(solve_batch(mode, batch), where)


@contextmanager
def reference_process(processes: int = 1) -> Iterator[Executor]:
    """Worker processes for the reference (forked where the platform can: the caller's
    kernels and monkeypatches come along); left at once, their work dropped, on an error or
    an interrupt."""
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    pool = ProcessPoolExecutor(max(1, processes), mp_context=multiprocessing.get_context(method),
                               initializer=_start_reference)
    try:
        yield pool
    except BaseException:
        # a worker in the middle of a batch would otherwise run on, and the interpreter
        # would wait for it at exit
        running = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in running:
            proc.terminate()
        raise
    pool.shutdown()


def _start_reference() -> None:
    """In the reference process: Ctrl-C is the parent's to handle (it ends this process), and
    SIGTERM ends it without the parent's handler (inherited by fork) printing a traceback;
    the backward's certified sweeps run in native code where the native tier is built
    (docs/numerics.md section 6.12)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    native_sweeps.use_native(native.built())


def _named(batch: list[VerifyCase]) -> str:
    first = batch[0]
    return (f"the batch that starts with {first.function} {first.dtype} "
            f"{first.shape[0]}x{first.shape[1]} ({first.generator})")


def result_of(pending: Future, what: str, keep: bool = False) -> Any:
    """A reference process's result, unpacked (handoff; keep: its files left for another
    reader); one that died becomes one line naming what it held."""
    try:
        return handoff.unpack(pending.result(), keep)
    except BrokenProcessPool:
        raise TruthError(f"the reference process died (killed, or out of memory) while "
                         f"preparing or evaluating {what}") from None
