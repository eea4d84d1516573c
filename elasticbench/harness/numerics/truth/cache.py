"""Solving many truths at once: the certified fast phase, mpmath for what it leaves, a cache.

Each question (TruthJob) is answered by the vectorized double-double reference first
(numerics/certified/rows_forward.py); the rows it cannot certify are evaluated in mpmath,
split into row chunks over worker processes when there is enough of that work, and only
those rows are kept on disk: a small cache, keyed by content (function, params, dtype,
shape, input bytes, rows, precision, version) and trimmed least-recently-used to a size
limit.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, fields, replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from elasticbench.harness.functions import get_function
from elasticbench.harness.numerics.certified import rows_forward as certified
from elasticbench.harness.numerics.certified import rows_grad as certified_grad
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.numerics.truth.row_truth import (
    TRUTH_VERSION,
    GradTruth,
    Truth,
    evaluate_rows,
)
from elasticbench.settings import settings

# Below this many elements of mpmath work, worker processes cost more than they save.
PARALLEL_MIN_ELEMENTS = 40_000
CHUNK_ELEMENTS = 16_384
_START_METHOD = "fork" if sys.platform.startswith("linux") else "spawn"
# Bump when the meaning of a cached gradient truth changes.
GRAD_VERSION = 2


class TruthError(RuntimeError):
    """The reference could not be computed (a worker died); one line naming the case."""


@dataclass(frozen=True)
class TruthJob:
    """One question for the reference: these rows of this input, this function and params."""

    function: str
    params: tuple[tuple[str, float], ...]
    dtype: str
    x64: np.ndarray  # exact float64 copy of the input
    rows: np.ndarray
    precision: int
    g64: np.ndarray | None = None  # upstream gradient: ask for gradients too (GradTruth)

    @property
    def truth_class(self) -> type[Truth]:
        return Truth if self.g64 is None else GradTruth

    def key(self) -> str:
        h = hashlib.sha256()
        meta = [TRUTH_VERSION, self.function, list(self.params), self.dtype,
                list(self.x64.shape), self.precision]
        if self.g64 is not None:
            meta.append(["bwd", GRAD_VERSION])
        h.update(json.dumps(meta).encode())
        h.update(np.ascontiguousarray(self.x64).tobytes())
        h.update(np.asarray(self.rows, dtype=np.int64).tobytes())
        if self.g64 is not None:
            h.update(np.ascontiguousarray(self.g64).tobytes())
        return h.hexdigest()

    def describe(self) -> str:
        """The case in words, for messages: function, dtype, shape, parameters."""
        params = ", ".join(f"{k}={v:g}" for k, v in self.params)
        mode = " backward" if self.g64 is not None else ""
        rows, n = self.x64.shape
        return f"{self.function}{mode} {self.dtype} {rows}x{n}" + (f" ({params})" if params else "")


@dataclass
class TruthStats:
    """How the truths of a run were obtained: elements in all, those mpmath computed (the
    fallback), those read from the cache, the seconds each phase took and, where the
    reference ran beside the kernels, the seconds the kernels waited for it."""

    elements: int = 0
    fallback_elements: int = 0
    fallback_rows: int = 0
    cached_elements: int = 0
    fast_s: float = 0.0
    fallback_s: float = 0.0
    wait_s: float = 0.0

    @property
    def fallback_share(self) -> float:
        return self.fallback_elements / self.elements if self.elements else 0.0

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "fallback_share": self.fallback_share}

    def add(self, other: TruthStats) -> None:
        """Count other's truths in this one (a batch's, computed elsewhere)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @classmethod
    def from_dict(cls, d: dict) -> TruthStats:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def summary(self) -> str:
        """One line for a run's summary."""
        waited = f", the kernels waited {self.wait_s:.1f}s for it" if self.wait_s else ""
        return (f"reference: {self.elements:,} values, {self.fallback_share:.2%} by mpmath "
                f"({self.fast_s:.1f}s certified, {self.fallback_s:.1f}s mpmath{waited})")


def default_cache_dir() -> Path:
    """$ELASTICBENCH_CACHE (elasticbench.settings), else $XDG_CACHE_HOME/elasticbench, else
    ~/.cache/elasticbench."""
    if (chosen := settings().cache) is not None:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "elasticbench"


class TruthStore:
    """mpmath truths in <dir>/truth/<key[:2]>/<key>.npz, at most max_mb megabytes (default
    $ELASTICBENCH_CACHE_MB or 200; the least recently used go first); None disables it."""

    def __init__(self, directory: Path | None, max_mb: float | None = None):
        self.dir = None if directory is None else Path(directory) / "truth"
        self.max_bytes = int((settings().cache_mb if max_mb is None else max_mb) * 1e6)
        self._bytes: int | None = None  # what the cache holds, counted once, then kept up

    def _path(self, key: str) -> Path:
        assert self.dir is not None
        return self.dir / key[:2] / f"{key}.npz"

    def get(self, key: str, cls: type[Truth] = Truth) -> Truth | None:
        if self.dir is None:
            return None
        path = self._path(key)
        try:
            with np.load(path) as z:
                truth = cls(*(z[f] for f in cls.FIELDS))
            os.utime(path)  # recently used
            return truth
        except (OSError, KeyError, ValueError):
            return None  # missing or damaged: recompute

    def put(self, key: str, truth: Truth) -> None:
        if self.dir is None or self.max_bytes <= 0:
            return
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **truth.arrays())
            os.replace(tmp, path)
            if self._bytes is None:
                self._bytes = self.size()
            else:
                self._bytes += path.stat().st_size
            if self._bytes > self.max_bytes:
                self.trim()
        except OSError:
            pass  # a read-only cache only costs time

    def size(self) -> int:
        """Bytes the cache holds now."""
        return sum(size for _, size, _ in self._entries())

    def _entries(self) -> list[tuple[Path, int, float]]:
        if self.dir is None or not self.dir.exists():
            return []
        out = []
        for p in self.dir.glob("*/*.npz"):
            try:
                st = p.stat()
            except OSError:
                continue
            out.append((p, st.st_size, st.st_mtime))
        return out

    def trim(self) -> None:
        """Drop the least recently used entries until the cache fits max_bytes."""
        entries = self._entries()
        total = sum(size for _, size, _ in entries)
        for path, size, _ in sorted(entries, key=lambda e: e[2]):
            if total <= self.max_bytes:
                break
            try:
                path.unlink()
                total -= size
            except OSError:
                pass
        self._bytes = total


def _evaluate(job: tuple) -> Truth:
    function, params, x64, rows, precision, g64 = job
    return evaluate_rows(function, params, x64, rows, precision, g64)


def _chunks(job: TruthJob) -> list[tuple]:
    n = job.x64.shape[1]
    per = max(1, CHUNK_ELEMENTS // max(n, 1))
    rows = np.asarray(job.rows)
    out = []
    for start in range(0, len(rows), per):
        sel = rows[start : start + per]
        # Ship only the rows a chunk needs, renumbered, so large inputs don't travel whole.
        out.append((job.function, dict(job.params), job.x64[sel], np.arange(len(sel)),
                    job.precision, None if job.g64 is None else job.g64[sel]))
    return out


def fast_phase(job: TruthJob) -> tuple[Truth, np.ndarray]:
    """The certified truth of a job's rows, and which rows (positions) it certified."""
    with np.errstate(all="ignore"):  # masked lanes hold inf and NaN; they are never read
        return _fast_phase(job)


def _fast_phase(job: TruthJob) -> tuple[Truth, np.ndarray]:
    fn = get_function(job.function)
    fmt = get_format(job.dtype)
    params = dict(job.params)
    if job.g64 is None:
        return certified.forward_truth(fn, params, job.x64, job.rows, fmt)
    if fn.gradient_row is None:
        raise ValueError(f"{job.function} has no gradient reference")
    truth, ok, params_ok = certified_grad.gradient_truth(fn, params, job.x64, job.g64,
                                                         job.rows, fmt)
    return truth, ok if params_ok else np.zeros_like(ok)


def solve(
    jobs: Sequence[TruthJob],
    store: TruthStore,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    stats: TruthStats | None = None,
) -> list[Truth]:
    """Truths for all jobs, in order: certified where the fast phase can, else from the
    cache or mpmath. Raises TruthError (one line naming the case) if a worker dies."""
    stats = stats if stats is not None else TruthStats()
    results: list[Truth] = []
    rest: list[tuple[int, TruthJob, np.ndarray]] = []  # (job index, fallback job, positions)
    for i, job in enumerate(jobs):
        started = time.perf_counter()
        truth, ok = fast_phase(job)
        stats.fast_s += time.perf_counter() - started
        stats.elements += truth.hi.size
        results.append(truth)
        if ok.all():
            if progress:
                progress(1)
            continue
        where = np.flatnonzero(~ok)
        rest.append((i, replace(job, rows=np.asarray(job.rows)[where]), where))
    started = time.perf_counter()
    _fallback(rest, results, store, workers, progress, stats)
    stats.fallback_s += time.perf_counter() - started
    return results


def _fallback(rest: list[tuple[int, TruthJob, np.ndarray]], results: list[Truth],
              store: TruthStore, workers: int | None,
              progress: Callable[[int], None] | None, stats: TruthStats) -> None:
    """mpmath (or the cache) for the rows the fast phase left; merged into results."""
    todo = []
    for i, job, where in rest:
        stats.fallback_rows += len(where)
        size = len(where) * job.x64.shape[1]
        stats.fallback_elements += size
        cached = store.get(job.key(), job.truth_class)
        if cached is not None:
            stats.cached_elements += size
            _merge(results[i], cached, where)
            if progress:
                progress(1)
        else:
            todo.append((i, job, where))
    if not todo:
        return
    work = sum(len(job.rows) * job.x64.shape[1] for _, job, _ in todo)
    workers = workers or os.cpu_count() or 1
    pieces = {i: _chunks(job) for i, job, _ in todo}
    if workers > 1 and work >= PARALLEL_MIN_ELEMENTS:
        # fork: no re-import of the caller's __main__ (scripts without a main guard work).
        # Workers only touch NumPy and mpmath, never torch's thread pools or a GPU.
        # forked from a thread other than the main one, a child could inherit locks that
        # the other threads hold: there, a fork server starts the workers instead
        method = _START_METHOD if threading.current_thread() is threading.main_thread() \
            else "forkserver" if sys.platform.startswith("linux") else "spawn"
        with ProcessPoolExecutor(workers, mp_context=get_context(method)) as pool:
            futures = {i: [pool.submit(_evaluate, c) for c in pieces[i]] for i, _, _ in todo}
            try:
                for i, job, where in todo:
                    try:
                        parts = [f.result() for f in futures[i]]
                    except BrokenProcessPool:
                        raise TruthError(
                            f"a reference worker died (killed, or out of memory) while "
                            f"evaluating {job.describe()} in mpmath; rerun with --jobs 1 "
                            f"to evaluate it in this process") from None
                    _finish_one(i, job, where, parts, results, store, progress)
            except BaseException:
                # an interrupt: leaving the block would otherwise wait for every queued
                # chunk; drop them and wait only for the ones running (what was stored stays)
                pool.shutdown(cancel_futures=True)
                raise
    else:
        for i, job, where in todo:
            _finish_one(i, job, where, [_evaluate(c) for c in pieces[i]], results, store,
                        progress)


def _finish_one(i: int, job: TruthJob, where: np.ndarray, parts: list[Truth],
                results: list[Truth], store: TruthStore,
                progress: Callable[[int], None] | None) -> None:
    truth = job.truth_class.concat(parts)
    truth.rows = np.asarray(job.rows, dtype=np.int64)
    store.put(job.key(), truth)
    _merge(results[i], truth, where)
    if progress:
        progress(1)


def _merge(into: Truth, part: Truth, where: np.ndarray) -> None:
    """Put the rows of part at positions `where` of into (same fields)."""
    for f in into.FIELDS:
        if f != "rows":  # kind is "U8" on both sides (certified.py, truth.py)
            getattr(into, f)[where] = getattr(part, f)


