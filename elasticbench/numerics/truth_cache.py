"""Solving many truths at once: a disk cache keyed by content, and worker processes.

The key hashes (function, params, dtype, shape, input bytes, rows, precision, version), so a
cached truth can never be served for a different question. mpmath work is split into row
chunks and spread over processes; small jobs run in-process to skip the start-up cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from .truth import TRUTH_VERSION, GradTruth, Truth, evaluate_rows

# Below this many elements of uncached work, worker processes cost more than they save.
PARALLEL_MIN_ELEMENTS = 40_000
CHUNK_ELEMENTS = 16_384
_START_METHOD = "fork" if sys.platform.startswith("linux") else "spawn"
# Bump when the meaning of a cached gradient truth changes.
GRAD_VERSION = 1


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


def default_cache_dir() -> Path:
    """$ELASTICBENCH_CACHE, else $XDG_CACHE_HOME/elasticbench, else ~/.cache/elasticbench."""
    if env := os.environ.get("ELASTICBENCH_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "elasticbench"


class TruthStore:
    """Content-addressed truths in <dir>/truth/<key[:2]>/<key>.npz; None disables the disk."""

    def __init__(self, directory: Path | None):
        self.dir = None if directory is None else Path(directory) / "truth"

    def _path(self, key: str) -> Path:
        assert self.dir is not None
        return self.dir / key[:2] / f"{key}.npz"

    def get(self, key: str, cls: type[Truth] = Truth) -> Truth | None:
        if self.dir is None:
            return None
        path = self._path(key)
        try:
            with np.load(path) as z:
                return cls(*(z[f] for f in cls.FIELDS))
        except (OSError, KeyError, ValueError):
            return None  # missing or damaged: recompute

    def put(self, key: str, truth: Truth) -> None:
        if self.dir is None:
            return
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **truth.arrays())
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache only costs time


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


def solve(
    jobs: Sequence[TruthJob],
    store: TruthStore,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Truth]:
    """Truths for all jobs, in order: from the cache where possible, else computed."""
    results: list[Truth | None] = []
    todo: list[int] = []
    keys = [job.key() for job in jobs]
    for i, key in enumerate(keys):
        cached = store.get(key, jobs[i].truth_class)
        results.append(cached)
        if cached is None:
            todo.append(i)
        elif progress:
            progress(1)
    if not todo:
        return results  # type: ignore[return-value]

    pieces = {i: _chunks(jobs[i]) for i in todo}
    work = sum(jobs[i].x64.shape[1] * len(jobs[i].rows) for i in todo)
    workers = workers or os.cpu_count() or 1
    if workers > 1 and work >= PARALLEL_MIN_ELEMENTS:
        # fork: no re-import of the caller's __main__ (scripts without a main guard work).
        # Workers only touch NumPy and mpmath, never torch's thread pools or a GPU.
        with ProcessPoolExecutor(workers, mp_context=get_context(_START_METHOD)) as pool:
            futures = {i: [pool.submit(_evaluate, c) for c in pieces[i]] for i in todo}
            try:
                for i in todo:
                    results[i] = _finish(jobs[i], [f.result() for f in futures[i]])
                    store.put(keys[i], results[i])
                    if progress:
                        progress(1)
            except BaseException:
                # an interrupt: leaving the block would otherwise wait for every queued
                # chunk; drop them and wait only for the ones running (what was stored stays)
                pool.shutdown(cancel_futures=True)
                raise
    else:
        for i in todo:
            results[i] = _finish(jobs[i], [_evaluate(c) for c in pieces[i]])
            store.put(keys[i], results[i])
            if progress:
                progress(1)
    return results  # type: ignore[return-value]


def _finish(job: TruthJob, parts: list[Truth]) -> Truth:
    truth = job.truth_class.concat(parts)
    truth.rows = np.asarray(job.rows, dtype=np.int64)
    return truth
