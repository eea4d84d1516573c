"""Same-run A/B: two versions of a kernel timed in interleaved rounds of one process.

Two versions of a kernel usually share a name, and the registry refuses a second kernel of the
same name from another file. So each version is loaded into a private copy of the registry and
renamed with a suffix (`name@base`, `name@current`); the real registry is left as it was.

Each round times one sample of A and one of B, in a seeded random order, on the same input
buffers. Load that comes and goes hits both samples of a round alike, so the per-round ratio
B/A is far steadier than either time, and the paired statistics (stats.ratio_paired) use it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from elasticbench.devices import HOST, CudaClock, HostClock, ThreadCPUClock, is_cuda
from elasticbench.harness.backends import get_backend
from elasticbench.harness.bench.cases import RunCase
from elasticbench.harness.bench.models import minimum_bytes
from elasticbench.harness.bench.rotation import rotating_call
from elasticbench.harness.bench.runner import params_for, set_threads, verify_quickly
from elasticbench.harness.gate.load import Dataset, Series, Verdict, case_label
from elasticbench.harness.inputs import generate
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.records import QuickVerdict, RunRecord
from elasticbench.harness.registry import (
    KernelFileError,
    KernelSpec,
    load_kernel_file,
    scoped_kernels,
)

SIDES = ("base", "current")


@dataclass(frozen=True)
class Pair:
    """The two versions of one kernel; `name` is what records and reports call it."""

    name: str
    base: KernelSpec
    current: KernelSpec


def load_version(path: str | Path, suffix: str, mode: str = "fwd") -> list[KernelSpec]:
    """The kernels a file registers, loaded privately and renamed name + suffix."""
    with scoped_kernels(alone=True):  # the real registry is left as it was
        specs = load_kernel_file(path)
    return [replace(s, name=s.name + suffix) for s in specs if s.mode == mode]


def pair_versions(base: list[KernelSpec], current: list[KernelSpec]) -> list[Pair]:
    """Match kernels by name across versions; a lone kernel on each side pairs with the other."""
    strip = {s.name: s.name.rsplit("@", 1)[0] for s in [*base, *current]}
    by_base = {strip[s.name]: s for s in base}
    pairs = [Pair(strip[c.name], by_base[strip[c.name]], c) for c in current
             if strip[c.name] in by_base]
    if not pairs and len(base) == 1 and len(current) == 1:
        pairs = [Pair(strip[current[0].name], base[0], current[0])]
    if not pairs:
        raise ValueError("the two versions have no kernel name in common "
                         f"(base: {', '.join(strip[s.name] for s in base) or 'none'}; "
                         f"current: {', '.join(strip[s.name] for s in current) or 'none'})")
    for p in pairs:
        if p.base.function != p.current.function or p.base.backend != p.current.backend:
            raise ValueError(f"{p.name}: the versions differ in function or backend")
    return pairs


def repo_root(start: Path) -> Path:
    out = subprocess.run(["git", "-C", str(start), "rev-parse", "--show-toplevel"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ValueError(f"{start} is not inside a git repository")
    return Path(out.stdout.strip())


@contextmanager
def revision_checkout(rev: str, start: Path) -> Iterator[tuple[Path, Path]]:
    """(repository root, a detached worktree of rev in a temp dir), removed afterwards."""
    root = repo_root(start)
    tmp = Path(tempfile.mkdtemp(prefix="elasticbench-ab-"))
    tree = tmp / "tree"
    proc = subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", "--quiet",
                           str(tree), rev], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        msg = (proc.stderr.strip().splitlines() or ["git worktree add failed"])[-1]
        raise ValueError(f"cannot check out {rev!r}: {msg}")
    try:
        yield root, tree
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                       capture_output=True, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def module_file(spec: KernelSpec) -> Path:
    """The source file that registered a kernel (a built-in module or a kernel file)."""
    if spec.source != "builtin":
        return Path(spec.source)
    mod = sys.modules.get(spec.fn.__module__)
    if mod is None or not getattr(mod, "__file__", None):
        raise ValueError(f"cannot find the source file of {spec.name}")
    return Path(mod.__file__)


@dataclass
class ABPolicy:
    """How an A/B comparison is timed."""

    rounds: int = 30
    warmup_s: float = 0.05
    min_sample_s: float = 0.002
    seed: int = 0
    threads: int | None = None  # None: the case's setting (0: every core)
    clock: str = "wall"  # or "cpu": the calling thread's CPU time (one thread, on the host)


def time_pair(pair: Pair, x: np.ndarray, params: dict[str, float], policy: ABPolicy,
              rng: np.random.Generator) -> dict[str, list[float]]:
    """Interleaved samples (ns per call) of both versions on the same input, with the clock
    of the current version's backend (a cold sample on a GPU is one call after a flush)."""
    rows, n = x.shape
    footprint = minimum_bytes(rows, n, x.itemsize, "fwd")
    calls = {"base": rotating_call(pair.base, [x], params, footprint),
             "current": rotating_call(pair.current, [x], params, footprint)}
    clock = ThreadCPUClock() if policy.clock == "cpu" else get_backend(pair.current.backend).clock()
    flush = calls["current"].out_of_cache and clock.flushes
    counter = {s: 0 for s in SIDES}

    def run(side: str, k: int) -> float:
        call = calls[side]
        if flush:
            clock.flush()
        clock.start()
        for _ in range(k):
            call(counter[side])
            counter[side] += 1
        return clock.stop()

    first = {s: run(s, 1) for s in SIDES}
    end = time.perf_counter() + policy.warmup_s
    while time.perf_counter() < end:
        for s in SIDES:
            first[s] = min(first[s], run(s, 1))
    # The same inner count for both sides, so a sample spans about the same wall time.
    single = flush or clock.single_call
    inner = 1 if single else max(1, int(policy.min_sample_s * 1e9 / max(1, min(first.values()))))
    samples: dict[str, list[float]] = {s: [] for s in SIDES}
    for _ in range(policy.rounds):
        order = SIDES if rng.random() < 0.5 else SIDES[::-1]
        for s in order:
            samples[s].append(run(s, inner) / inner)
    for call in calls.values():
        call.release()
    return samples


@dataclass
class ABResult:
    """Both sides as datasets (paired, same keys), and the records to save."""

    base: Dataset
    current: Dataset
    records: list[dict[str, Any]]
    threads: int = 0


def run_ab(pairs: list[Pair], case: RunCase, dtypes: list[str], shapes: list[tuple[int, int]],
           policy: ABPolicy, *, verify: bool = True, store: Any = None,
           on_cell: Callable[[str], None] = lambda s: None) -> ABResult:
    """Verify both versions (unless told not to), then time every pair on every cell."""
    from elasticbench.harness.environment import describe

    wanted_threads = case.threads if policy.threads is None else policy.threads
    on_device = any(get_backend(s.backend).device() != HOST
                    for p in pairs for s in (p.base, p.current))
    if policy.clock == "cpu" and (wanted_threads != 1 or on_device):
        raise ValueError("--clock cpu times the calling thread: it needs --threads 1 and "
                         "kernels that run on the host")

    # the GPU is part of the machine when the kernels run on it (asking costs a CUDA init,
    # which host kernels are spared), so that a gate on the samples compares GPUs
    machine = describe(include_gpu=on_device)["machine"]
    base = Dataset("A (base)", "run", machine, "time")
    current = Dataset("B (current)", "run", machine, "time")
    if verify:
        from elasticbench.harness.numerics.truth.cache import TruthStore, default_cache_dir

        specs = [s for p in pairs for s in (p.base, p.current)]
        verdicts = verify_quickly(specs, case, dtypes, store or TruthStore(default_cache_dir()))
        for p in pairs:
            for d in dtypes:
                for spec, ds in ((p.base, base), (p.current, current)):
                    v = verdicts.get((spec.name, d)) or QuickVerdict(status="unverified")
                    key = ("numerics", p.name, d)
                    ds.numerics[key] = Verdict(key, p.name, d, v.passed, v.max_ulp, None,
                                               v.reason)
    threads = set_threads(wanted_threads)
    rng = np.random.default_rng(policy.seed)
    records: list[dict[str, Any]] = []
    for p in pairs:
        params = params_for(case, p.current.function)
        # what time_pair times by (devices.clock's choice): CUDA events for a GPU's kernels
        device = get_backend(p.current.backend).device()
        clock_name = (ThreadCPUClock.name if policy.clock == "cpu"
                      else (CudaClock if is_cuda(device) else HostClock).name)
        for d in dtypes:
            if not (p.base.supports(d) and p.current.supports(d)):
                continue  # a format a version does not take: skipped, as run skips it
            for shape in shapes:
                on_cell(f"{p.name} {d} {shape[0]}x{shape[1]}")
                x = generate(case.generator, d, shape, case.seed)
                if x.dtype.itemsize != get_format(d).itemsize:
                    raise ValueError(f"generator gave {x.dtype} for {d}")
                samples = time_pair(p, x, params, policy, rng)
                for side, ds in (("base", base), ("current", current)):
                    rec = {"kernel": p.name, "version": side,
                           "source": (p.base if side == "base" else p.current).source,
                           "function": p.current.function, "backend": p.current.backend,
                           "mode": "fwd", "dtype": d, "shape": list(shape), "params": params,
                           "generator": case.generator, "seed": case.seed,
                           "timing": {"samples_ns": samples[side], "paired": True,
                                      "clock": clock_name},
                           "median_s": float(np.median(samples[side])) * 1e-9}
                    records.append(rec)  # written as A/B files always had it
                    typed = RunRecord.from_dict(rec)
                    key = ("run", *typed.key)
                    costs = np.asarray(samples[side]) * 1e-9
                    ds.series[key] = Series(key, p.name, case_label(typed), costs,
                                            float(np.median(costs)))
    return ABResult(base, current, records, threads["threads"])


def versions_from_files(base_file: str, current_file: str) -> list[Pair]:
    """Two kernel files, base then current."""
    return pair_versions(load_version(base_file, "@base"), load_version(current_file, "@current"))


def versions_from_revision(rev: str, files: list[str], only: list[str]) -> list[Pair]:
    """Each file (and each named built-in kernel's module) as of rev, against the working tree."""
    from elasticbench.harness.registry import get_kernel

    sources = [Path(f).resolve() for f in files]
    for name in only:
        sources.append(module_file(get_kernel(name)).resolve())
    if not sources:
        raise ValueError("--rev needs --kernel-file or --only to say what to compare")
    pairs: list[Pair] = []
    with revision_checkout(rev, sources[0].parent) as (root, tree):
        for src in dict.fromkeys(sources):
            try:
                rel = src.relative_to(root)
            except ValueError:
                raise ValueError(f"{src} is not inside the repository {root}") from None
            old = tree / rel
            if not old.is_file():
                raise ValueError(f"{rel} does not exist at {rev}")
            base = load_version(old, "@base")
            current = load_version(src, "@current")
            if only:
                wanted = set(only)
                base = [s for s in base if s.name.rsplit("@", 1)[0] in wanted]
                current = [s for s in current if s.name.rsplit("@", 1)[0] in wanted]
            if base and current:
                pairs += pair_versions(base, current)
    if not pairs:
        raise ValueError(f"nothing to compare between {rev} and the working tree")
    return pairs


__all__ = [
    "ABPolicy",
    "ABResult",
    "KernelFileError",
    "Pair",
    "pair_versions",
    "run_ab",
    "versions_from_files",
    "versions_from_revision",
]
