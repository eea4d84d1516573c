"""The timing engine: warm-up, adaptive repetitions, raw samples, median and IQR.

One sample is the time of `inner` consecutive calls divided by `inner`; `inner` grows until a
sample lasts at least `min_sample_s`, so the clock's resolution never dominates. On a GPU
a sample is one call (CUDA events resolve it, and the clock hides the host's launch); a
cold one follows a flush of the L2.
Repetitions continue until the spread (IQR / median) is below `target_spread` or the budget
is spent. The clock is the device's (elasticbench.devices), given by the kernel's backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from elasticbench.devices import Clock
from elasticbench.harness.records import TimingRecord


@dataclass(frozen=True)
class Policy:
    """How long and how often to measure one kernel on one input."""

    warmup_s: float = 0.05
    min_reps: int = 5
    max_reps: int = 200
    budget_s: float = 1.0
    target_spread: float = 0.10
    min_sample_s: float = 0.0005
    processes: int = 1  # fresh worker processes per kernel and case (1: the run's own)
    settle_s: float = 2.0  # the warm-up goes on, up to this, while calls fault in fresh pages

    def __post_init__(self) -> None:
        if self.min_reps < 3 or self.max_reps < self.min_reps:
            raise ValueError("repetitions: need 3 <= min_reps <= max_reps")
        if self.budget_s <= 0 or self.warmup_s < 0 or not 0 < self.target_spread < 1:
            raise ValueError("budget_s > 0, warmup_s >= 0 and 0 < target_spread < 1 required")
        if not self.settle_s >= 0:
            raise ValueError("settle_s >= 0 required")
        if isinstance(self.processes, bool) or not isinstance(self.processes, int) \
                or self.processes < 1:
            raise ValueError("processes must be a whole number >= 1")

    def per_process(self) -> Policy:
        """What each of `processes` processes spends: a share of the budget and of the
        repetitions (never under min_reps), a full warm-up each."""
        if self.processes == 1:
            return self
        return replace(self, budget_s=self.budget_s / self.processes,
                       max_reps=max(self.min_reps, self.max_reps // self.processes))


@dataclass
class Stats:
    """Summary of raw per-call samples (nanoseconds)."""

    median_ns: float
    q1_ns: float
    q3_ns: float
    iqr_ns: float
    min_ns: float
    spread: float  # IQR / median


def summarize(samples_ns: list[float] | np.ndarray) -> Stats:
    """Median, quartiles and IQR/median of raw samples."""
    a = np.asarray(samples_ns, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no samples")
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    from scipy import stats  # imported here: half a second that only timing needs

    iqr = float(stats.iqr(a))
    return Stats(float(med), float(q1), float(q3), iqr, float(a.min()),
                 iqr / float(med) if med > 0 else float("inf"))


@dataclass
class Timing:
    """The outcome of timing one kernel on one input: raw samples and their summary."""

    samples_ns: list[float]
    inner: int
    stats: Stats
    converged: bool
    clock: str
    warning: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"samples_ns": self.samples_ns, "inner": self.inner, **asdict(self.stats),
                "reps": len(self.samples_ns), "converged": self.converged,
                "clock": self.clock, "warning": self.warning, **self.extra}

    def to_record(self) -> TimingRecord:
        """The `timing` field of a run record (extra probe notes are the ceilings' own)."""
        return TimingRecord(samples_ns=list(self.samples_ns), inner=self.inner,
                            **asdict(self.stats), reps=len(self.samples_ns),
                            converged=self.converged, clock=self.clock, warning=self.warning,
                            processes=self.extra.get("processes"))


def pooled(timings: list[Timing]) -> Timing:
    """The timings of one kernel and case from several processes as one: samples one process
    after another, `processes` counting each one's, the summary over all of them."""
    if len(timings) == 1:
        return timings[0]
    samples = [s for t in timings for s in t.samples_ns]
    warnings = [t.warning for t in timings if t.warning]
    return Timing(samples, timings[0].inner, summarize(samples),
                  all(t.converged for t in timings), timings[0].clock,
                  warnings[0] if warnings else None,
                  {"processes": [len(t.samples_ns) for t in timings]})


def _finish(samples: list[float], inner: int, policy: Policy, clock: str) -> Timing:
    st = summarize(samples)
    converged = st.spread < policy.target_spread
    warning = None if converged else (
        f"spread stayed at {100 * st.spread:.0f}% of the median after {len(samples)} "
        f"repetitions (target {100 * policy.target_spread:.0f}%): the machine is noisy")
    return Timing(samples, inner, st, converged, clock, warning)


def _adaptive(sample: Callable[[], float], policy: Policy, clock: str, inner: int) -> Timing:
    """Collect samples until the spread target or the budget is reached."""
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < policy.max_reps:
        samples.append(sample())
        if len(samples) >= policy.min_reps:
            if summarize(samples).spread < policy.target_spread:
                break
            if time.perf_counter() - start > policy.budget_s:
                break
    return _finish(samples, inner, policy, clock)


def counted(call: Callable[[int], object]) -> Callable[[], None]:
    """call(0), call(1), ... as a callable without arguments (call(i) may rotate buffers)."""
    n = 0

    def step() -> None:
        nonlocal n
        call(n)
        n += 1

    return step


def minor_faults() -> int:
    """This process's minor page faults so far (0 where the OS does not count them)."""
    try:
        import resource
    except ImportError:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


# Page faults a warm call may still take (the interpreter's own small allocations), and how
# many such calls in a row make the heap settled (a fresh process alternates between calls
# that fault and calls that do not before it settles).
FRESH_PAGES = 16
SETTLED_CALLS = 3


def warm_up(run: Callable[[int], float], policy: Policy,
            faults: Callable[[], int] = minor_faults) -> int:
    """run(1) at least once and for warmup_s, then on, up to settle_s, until SETTLED_CALLS
    calls in a row fault in no fresh pages; return the calls per sample (`inner`) that make a sample last
    min_sample_s, from the fastest warm call (run(k) times k calls, in ns).

    A fresh process's first calls of a large shape get their output on fresh pages, and the
    heap takes several calls to settle (torch.softmax of 64x262144 fp32 on this project's
    host: 23-26 ms and 16384 faults a call, with a clean call between them, for up to 8
    calls, then 10 ms and none). The baseline, timed first in every process, would carry
    that into every speedup."""
    start = time.perf_counter()
    fastest = float("inf")
    clean = 0  # calls in a row without fresh pages
    while True:
        before = faults()
        fastest = min(fastest, run(1))
        clean = clean + 1 if faults() - before <= FRESH_PAGES else 0
        elapsed = time.perf_counter() - start
        if elapsed >= policy.warmup_s and (clean >= SETTLED_CALLS or elapsed >= policy.settle_s):
            return max(1, int(policy.min_sample_s * 1e9 / max(fastest, 1)))


def time_calls(call: Callable[[int], object], policy: Policy, clock: Clock, *,
               cold: bool = False) -> Timing:
    """Time call(i) with the device's clock; i counts calls, so the caller can rotate over
    input buffers. cold: evict the device's cache before every sample, outside the timed
    span (a clock that cannot flush relies on that rotation); warm samples repeat the call
    `inner` times on what the cache already holds, or call it once where the clock times a
    single call exactly (a GPU's)."""
    step = counted(call)
    flush = cold and clock.flushes

    def run(k: int) -> float:
        if flush:
            clock.flush()
        clock.start()
        for _ in range(k):
            step()
        return clock.stop()

    sized = warm_up(run, policy)
    inner = 1 if flush or clock.single_call else sized
    return _adaptive(lambda: run(inner) / inner, policy, clock.name, inner)
