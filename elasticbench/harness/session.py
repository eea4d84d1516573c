"""A results session: one results file filled by a job, the skeleton `run` and `verify` share.

A Job says what to do: its whole plan of items, the key that places an item in a shard, and
how to work through the items it is given, handing each finished record to the session. The
session does the rest the same way for every command: it checks that the results file can
be written, continues it (--resume) or starts it, keeps this process's shard of the plan
(writing the shard header that merge checks), shows progress, turns SIGTERM into an
interrupt, and closes the file, complete or not, with the time spent. A job that is
interrupted loses nothing it has handed over.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from elasticbench.harness.interrupt import sigterm_as_interrupt
from elasticbench.harness.records import (
    RECORD_TYPES,
    Record,
    ResultsFileError,
    ResultsWriter,
    check_writable,
    resume_writer,
)
from elasticbench.harness.shards import select_shard, shard_header

Item = TypeVar("Item")


class SessionError(ValueError):
    """The session cannot start (the results file cannot be written or resumed); one line."""


class Job(ABC, Generic[Item]):
    """What one command does inside a session."""

    kind: ClassVar[str]  # the results kind its records are: "run" or "verify"

    @abstractmethod
    def plan(self) -> list[Item]:
        """Every item of the whole plan, before sharding, in the order to work through them."""

    @abstractmethod
    def shard_key(self, item: Item) -> Any:
        """What places an item in a shard: JSON-able, equal across processes and machines."""

    @abstractmethod
    def work(self, items: list[Item], session: Session) -> None:
        """Work through items (this shard's), skipping what session.records already holds
        (a resumed file), and hand each finished record to session.add."""


class Task:
    """One progress bar of a session."""

    def __init__(self, progress: Progress, task: TaskID):
        self._progress, self._task = progress, task

    def advance(self, steps: float = 1) -> None:
        self._progress.advance(self._task, steps)

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)


class Session:
    """One results file being written: records arrive one by one and are never reworked.

    path None keeps the records in memory only (verify without --json). With resume, the
    file at path is continued: its records stay and a job skips what they cover.
    """

    def __init__(self, kind: str, path: Path | None, meta: dict[str, Any], *,
                 resume: bool = False, console: Console | None = None):
        if path is not None:
            try:
                check_writable(path)
            except OSError as e:
                raise SessionError(f"cannot write results file {path}: {e.strerror or e}"
                                   ) from None
        if resume and path is None:
            raise SessionError("resuming needs the results file to continue")
        try:
            self._writer = (resume_writer(path, kind, meta) if resume and path is not None
                            else ResultsWriter(path, kind, meta))
        except ResultsFileError as e:
            raise SessionError(str(e)) from None
        self._records: list[Record] = [RECORD_TYPES[kind].from_dict(r)
                                       for r in self._writer.records]  # checked when read
        self.kind, self.path = kind, path
        self.complete = False
        self.elapsed_s = 0.0
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeRemainingColumn(), console=console,
                                  transient=True,
                                  disable=console is None or not console.is_terminal)

    @property
    def header(self) -> dict[str, Any]:
        """The results document being written; a job may add to its header (ceilings, say)."""
        return self._writer.doc

    @property
    def records(self) -> list[Record]:
        """Every record of the file so far, a resumed file's first."""
        return self._records

    def add(self, record: Record) -> None:
        """Keep a finished record (on disk within a couple of seconds)."""
        if not isinstance(record, RECORD_TYPES[self.kind]):
            raise TypeError(f"a {self.kind} results file takes {RECORD_TYPES[self.kind].__name__}"
                            f"s, not {type(record).__name__}")
        self._records.append(record)
        self._writer.add(record.to_dict())

    def task(self, description: str, total: float) -> Task:
        """A new progress bar (drawn only on a terminal)."""
        return Task(self._progress, self._progress.add_task(description, total=total))

    def shard(self, items: list[Item], job: Job[Item], k: int, n: int) -> list[Item]:
        """This process's shard k of n of items; the header says which, for merge."""
        mine = select_shard(items, k, n, key=job.shard_key)
        self.header["shard"] = shard_header(k, n, [job.shard_key(it) for it in items],
                                            len(mine))
        return mine

    def run(self, job: Job[Any], shard: tuple[int, int] | None = None) -> bool:
        """Do the job's plan (shard k of n of it, if given); True when it finished, False when
        interrupted (Ctrl-C or SIGTERM). The file is closed either way."""
        if job.kind != self.kind:
            raise ValueError(f"a {job.kind} job cannot write a {self.kind} results file")
        items = job.plan()
        if shard is not None:
            items = self.shard(items, job, *shard)
        with self._running():
            job.work(items, self)
        return self.complete

    @contextmanager
    def _running(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            with sigterm_as_interrupt(), self._progress:
                yield
            self.complete = True
        except KeyboardInterrupt:
            self.complete = False
        finally:
            self.elapsed_s = time.perf_counter() - started
            self.header["elapsed_s"] = self.elapsed_s
            self._writer.close(complete=self.complete)
