"""A second kernel lane: on two cores or more, a verification's kernels are shared between
its own process and a second interpreter, which judges its kernels on each batch beside it.

The reference processes leave a core idle for much of a verification (the kernels' side,
torch.compile's tracing above all, is the longer one), so the kernels' work is split in two:
a kernel that compiles code per input shape (KernelSpec.compiles) stays in one process, every
other one of them going to the lane, so that its code is compiled once; the other kernels
go with their case, every other case to the lane, so that what scoring derives from a
case's truth is derived in one process only. The lane gets each batch's inputs and truths
through the same hand-over files as the parent (elasticbench.harness.handoff) and sends its records
back the same way. Records are the ones the parent would have made; only their order differs
(a lane's records come as it answers: verify/dispatch.py). A lane that dies hands its batch
back: the parent judges that share itself, and every share after it (docs/numerics.md
section 6.9).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from elasticbench.harness import handoff
from elasticbench.harness.execute import IN_PROCESS, Worker
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import BUILTIN_MODULES, KernelSpec

MIN_PAIRS = 2000  # (case, kernel) pairs a lane's share must reach to pay for its start-up


def travels(spec: KernelSpec) -> bool:
    """Whether a fresh interpreter finds the kernel by name: a built-in, or one of a kernel
    file (loaded there). A kernel registered by code the lane does not run stays here."""
    if spec.source != "builtin":
        return True
    return getattr(spec.fn, "__module__", None) in BUILTIN_MODULES


@dataclass(frozen=True)
class Share:
    """Which kernels of a case the lane judges: the compiling kernels named in `kernels`,
    and every kernel that travels but does not compile, on every other case."""

    kernels: frozenset[tuple[str, str]]

    def of(self, position: int, specs: list[KernelSpec]) -> list[KernelSpec]:
        """The lane's kernels among specs, those of the case at this position of the run."""
        return [k for k in specs if (k.name, k.mode) in self.kernels
                or (position % 2 == 1 and not k.compiles and travels(k))]


def lane_share(kernels: list[KernelSpec], pairs: Callable[[KernelSpec], int],
               cores: int | None = None) -> Share | None:
    """The lane's share (Share): every other compiling kernel that travels, and half the
    cases of the others; None with fewer than two cores, or when the share would judge
    fewer than MIN_PAIRS (case, kernel) pairs."""
    if cores is None:
        cores = os.cpu_count() or 1
    going = [k for k in kernels if travels(k)]
    fixed = [k for k in going if k.compiles][0::2]
    judged = sum(pairs(k) for k in fixed) + sum(pairs(k) for k in going if not k.compiles) / 2
    if cores < 2 or len(kernels) < 2 or judged < MIN_PAIRS:
        return None
    return Share(frozenset((k.name, k.mode) for k in fixed))


def judge_share(handed: bytes, share: list[list[KernelSpec]], one: Callable[..., VerifyRecord],
                scale: float, where: Path) -> bytes:
    """In the lane: a batch's inputs and truths (handed over), each judged by its share of
    the kernels with `one` (runner.judge_one); the records, packed into one
    file of `where`."""
    prepared, truths, _ = handoff.unpack(handed)
    records = [one(spec, prep, truth, IN_PROCESS, scale)
               for prep, truth, specs in zip(prepared, truths, share, strict=True)
               for spec in specs]
    return handoff.pack(records, where, whole=True)


class Lane:
    """The second interpreter, fed batches as their truths come in; its answers, in order,
    are read as they come by a thread of their own, so the parent can ask whether the
    oldest is in without waiting for it."""

    def __init__(self, one: Callable[..., VerifyRecord], scale: float, where: Path) -> None:
        self.one, self.scale, self.where = one, scale, where
        self.worker = Worker(warm=False)  # the parent judges its share while the lane starts
        self.alive, self.fresh = True, True
        self.held = 0  # batches sent, their answers not yet received
        self._expected: queue.SimpleQueue[bool] = queue.SimpleQueue()  # False: stop reading
        self._answers: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None

    def send(self, handed: bytes, share: list[list[KernelSpec]]) -> bool:
        """The batch handed to the lane; False (its files removed) once the lane is gone. A
        lane is started once, never again: a fresh one would answer for batches it never
        had."""
        proc = self.worker.proc
        self.alive = self.alive and (self.fresh or (proc is not None and proc.poll() is None))
        if self.alive:
            # the call goes through a file: through the pipe, a call larger than its buffer
            # would hold the parent until the lane had answered every batch before it
            call = handoff.pack(partial(judge_share, handed, share, self.one, self.scale,
                                        self.where), self.where, whole=True)
            if self.worker.submit(partial(_called, call), start=self.fresh):
                self.fresh = False
                self.held += 1
                if self._reader is None:
                    self._reader = threading.Thread(target=self._read, daemon=True)
                    self._reader.start()
                self._expected.put(True)
                return True
            handoff.discard(call)
        self.alive = self.fresh = False
        handoff.discard(handed)
        return False

    def ready(self) -> bool:
        """Whether receive() answers without waiting (nothing held: it would not)."""
        return self.held > 0 and not self._answers.empty()

    def receive(self) -> list[VerifyRecord] | None:
        """The records of the oldest batch sent; None once the lane has died (on this batch
        or before it): every batch it held is then the parent's to judge."""
        self.held -= 1
        packed = self._answers.get()
        if packed is None:
            self.alive = False
            return None
        return handoff.unpack(packed)

    def _read(self) -> None:
        """In the reader thread: an answer (None once the lane is dead) for every batch sent."""
        dead = False
        while self._expected.get():
            packed = None if dead else self.worker.collect(None, lambda why, s: None)
            dead = packed is None
            self._answers.put(packed)

    def stop(self) -> None:
        self.worker.stop()
        self._expected.put(False)


def _called(call: bytes) -> Any:
    """In the lane: the call packed in a file (handoff.pack), made."""
    return handoff.unpack(call)()


@contextmanager
def lane(one: Callable[..., VerifyRecord], scale: float, where: Path) -> Iterator[Lane]:
    """A lane judging with `one`, stopped on leaving (its unfinished batch dropped),
    whatever the way out."""
    second = Lane(one, scale, where)
    try:
        yield second
    finally:
        second.stop()
