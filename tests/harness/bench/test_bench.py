"""Timing statistics, roofline arithmetic and [run] case validation (no timings asserted)."""

from __future__ import annotations

import numpy as np
import pytest

from elasticbench.devices import HostClock
from elasticbench.harness.bench import timing
from elasticbench.harness.bench.cases import RunCase, parse_run_table, parse_size
from elasticbench.harness.bench.models import minimum_bytes, minimum_model, model_of
from elasticbench.harness.bench.roofline import roof_for
from elasticbench.harness.bench.runner import Ceilings, plan_units, run_units
from elasticbench.harness.bench.timing import (
    FRESH_PAGES,
    SETTLED_CALLS,
    Policy,
    pooled,
    summarize,
    time_calls,
    warm_up,
)
from elasticbench.harness.passes import PassModel
from elasticbench.harness.records import RunRecord
from elasticbench.harness.registry import KernelSpec, get_kernel
from elasticbench.harness.verify.tables import CaseFileError


def test_summarize_on_synthetic_samples():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median_ns == 3.0
    assert s.q1_ns == 2.0 and s.q3_ns == 4.0
    assert s.iqr_ns == pytest.approx(2.0)
    assert s.spread == pytest.approx(2.0 / 3.0)
    assert s.min_ns == 1.0


def test_summarize_rejects_empty():
    with pytest.raises(ValueError):
        summarize([])


def test_time_cpu_keeps_raw_samples_and_rotates():
    seen: list[int] = []
    t = time_calls(lambda i: seen.append(i), Policy(warmup_s=0, min_reps=3, max_reps=5,
                                                    budget_s=0.05), HostClock())
    assert 3 <= len(t.samples_ns) <= 5
    assert seen == list(range(len(seen)))  # call index counts up: callers rotate buffers
    d = t.to_dict()
    assert d["reps"] == len(t.samples_ns) and d["clock"] == "perf_counter_ns"
    assert (t.warning is None) == t.converged


class RecordingClock:
    """A fake device clock: what happened, in order; each span lasts 1000 ns per call."""

    name = "fake"

    def __init__(self, flushes: bool, single_call: bool = False):
        self.flushes, self.single_call, self.events, self.calls = flushes, single_call, [], 0

    def start(self):
        self.events.append("start")
        self.calls = 0

    def stop(self):
        self.events.append("stop")
        return 1000.0 * self.calls

    def flush(self):
        self.events.append("flush")

    def call(self, i):
        self.events.append("call")
        self.calls += 1


def _spans(events: list[str]) -> list[list[str]]:
    """The events between each start and its stop."""
    out, span = [], None
    for e in events:
        if e == "start":
            span = []
        elif e == "stop":
            out.append(span)
            span = None
        elif span is not None:
            span.append(e)
    return out


POLICY = Policy(warmup_s=0, min_reps=3, max_reps=4, budget_s=0.05, min_sample_s=5e-6)


def test_cold_samples_flush_outside_the_span_one_call_each():
    clock = RecordingClock(flushes=True)
    t = time_calls(clock.call, POLICY, clock, cold=True)
    assert t.inner == 1 and t.clock == "fake"
    assert all(span == ["call"] for span in _spans(clock.events))
    starts = [i for i, e in enumerate(clock.events) if e == "start"]
    assert all(clock.events[i - 1] == "flush" for i in starts)  # each span follows a flush


def test_warm_samples_never_flush():
    # in-cache means warm: nothing evicts the cache between samples (a GPU's L2 included)
    clock = RecordingClock(flushes=True)
    t = time_calls(clock.call, POLICY, clock)
    assert "flush" not in clock.events
    assert t.inner == 5 and _spans(clock.events)[-1] == ["call"] * 5


def test_a_clock_that_times_one_call_exactly_takes_warm_samples_of_one_call():
    clock = RecordingClock(flushes=True, single_call=True)
    t = time_calls(clock.call, POLICY, clock)
    assert "flush" not in clock.events and t.inner == 1
    assert all(span == ["call"] for span in _spans(clock.events))


def test_a_clock_that_cannot_flush_relies_on_rotation_when_cold():
    clock = RecordingClock(flushes=False)
    t = time_calls(clock.call, POLICY, clock, cold=True)
    assert "flush" not in clock.events and t.inner == 5


def test_policy_validation():
    with pytest.raises(ValueError):
        Policy(min_reps=2)
    with pytest.raises(ValueError):
        Policy(target_spread=0)
    with pytest.raises(ValueError):
        Policy(processes=0)


def test_the_warm_up_waits_for_calls_that_no_longer_fault_in_fresh_pages(monkeypatch) -> None:
    """A process's first calls that page in a fresh output are warm-up, not samples: the
    warm-up runs on until SETTLED_CALLS calls in a row fault no more than the interpreter's
    own few pages (one clean call between faulting ones does not end it), and gives up
    after settle_s (a kernel that maps fresh memory every call)."""
    calls, faults = [], [0]
    pattern = [True, False, True, True] + [False] * 10  # faults in fresh pages?

    def run(k: int) -> float:
        fresh = pattern[len(calls)]
        calls.append(k)
        faults[0] += 16384 if fresh else FRESH_PAGES
        return 25e6 if fresh else 10e6

    inner = warm_up(run, Policy(warmup_s=0.0, min_sample_s=0.05), faults=lambda: faults[0])
    assert len(calls) == 4 + SETTLED_CALLS and inner == 5  # 0.05 s over the fastest, 10 ms

    calls.clear()
    always = [0]

    def faulting(k: int) -> float:
        calls.append(k)
        always[0] += 16384
        now[0] += 0.001
        return 1e6

    # 1 ms calls on a clock of the test's own (a loaded machine's sleep overshoots)
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    warm_up(faulting, Policy(warmup_s=0.0, settle_s=0.02), faults=lambda: always[0])
    assert len(calls) == 20  # stopped by settle_s (20 ms), never settled
    calls.clear()
    warm_up(faulting, Policy(warmup_s=0.0, settle_s=0.0), faults=lambda: always[0])
    assert len(calls) == 1
    with pytest.raises(ValueError, match="settle_s"):
        Policy(settle_s=-1.0)


def test_processes_share_the_budget_and_pool_their_samples():
    p = Policy(min_reps=5, max_reps=40, budget_s=0.6, processes=3).per_process()
    assert p.budget_s == pytest.approx(0.2) and p.max_reps == 13 and p.min_reps == 5
    assert Policy(min_reps=5, max_reps=8, processes=4).per_process().max_reps == 5
    one = Policy(warmup_s=0, min_reps=3, max_reps=4, budget_s=0.01)
    a, b = time_calls(lambda i: None, one, HostClock()), time_calls(lambda i: None, one,
                                                                   HostClock())
    both = pooled([a, b])
    assert both.samples_ns == a.samples_ns + b.samples_ns
    assert both.to_dict()["processes"] == [len(a.samples_ns), len(b.samples_ns)]
    assert "processes" not in pooled([a]).to_dict()


def test_units_are_timed_in_fresh_processes_and_an_interrupt_keeps_what_was_measured():
    case = RunCase(name="t", timing=Policy(warmup_s=0, min_reps=3, max_reps=4, budget_s=0.01,
                                           min_sample_s=0.0001, processes=2))
    units = plan_units([get_kernel("numpy_elastic")], None, case, ["fp32"], [(2, 64), (2, 96)])
    ceilings = Ceilings("cpu", 32 << 20, 1e10, {"fp32": 1e9, "fp64": 1e9})
    steps: list[int] = []

    def step() -> None:
        steps.append(1)
        if len(steps) == 3:  # the second pass has measured the first unit
            raise KeyboardInterrupt

    records: list[RunRecord] = []
    with pytest.raises(KeyboardInterrupt):
        run_units(case, units, ceilings, {}, on_measured=step, on_record=records.append)
    assert [r.shape for r in records] == [(2, 64), (2, 96)]
    first, second = (r.timing for r in records)
    assert len(first.processes) == 2 and sum(first.processes) == first.reps
    assert second.processes is None and second.reps >= 3  # measured by one process


def test_roof_arithmetic_exp_binds():
    # 32 GB/s copy, fp32 three-pass: 16 B/element -> 2 G/s; exp 2 G/s / 2 exps -> 1 G/s.
    r = roof_for(PassModel("three", 3, 1, 2), minimum_model("elastic", "fwd"), 4, 32e9, 2e9)
    assert r.memory_eps == pytest.approx(2e9)
    assert r.exp_eps == pytest.approx(1e9)
    assert r.roof_eps == pytest.approx(1e9) and r.binding == "exp"
    assert r.ideal_memory_eps == pytest.approx(4e9)


def test_roof_arithmetic_memory_binds_and_no_exp():
    r = roof_for(PassModel("copy", 1, 1, 0), minimum_model("symax", "fwd"), 4, 32e9, 2e9)
    assert r.binding == "memory" and r.roof_eps == pytest.approx(4e9)


def test_minimum_bytes():
    assert minimum_bytes(64, 262144, 4, "fwd") == 2 * 64 * 262144 * 4
    assert minimum_bytes(2, 10, 2, "bwd") == 3 * 2 * 10 * 2


def test_declared_model_is_read_from_the_kernel():
    def k(x, *, tau, beta):
        return x

    spec = KernelSpec("k", "elastic", "numpy", k, model=PassModel("exp-once", 2, 2, 1))
    assert model_of(spec).structure == "exp-once" and model_of(spec).writes == 2
    plain = KernelSpec("p", "elastic", "numpy", lambda x, **kw: x)
    assert model_of(plain).declared is False and model_of(plain).exps == 1


@pytest.mark.parametrize("text,shape", [("64x262144", (64, 262144)), (" 2 X 3 ", (2, 3)),
                                        ([4, 5], (4, 5))])
def test_parse_size(text, shape):
    assert parse_size(text) == shape


@pytest.mark.parametrize("bad", ["0x5", "4096", "axb", "5x0", [1], "-1x4"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("table,message", [
    ({"sizes": ["0x5"]}, "run.sizes"),
    ({"dtypes": ["fp8"]}, "unknown dtype"),
    ({"functions": ["nope"]}, "unknown function"),
    ({"mode": "sideways"}, "run.mode"),
    ({"colour": 1}, "no key 'colour'"),
    ({"timing": {"min_reps": 1}}, "run.timing"),
    ({"timing": {"budget": 1}}, "no key 'budget'"),
    ({"params": {"elastic": {"tau": 0}}}, "run.params.elastic"),
    ({"threads": -1}, "run.threads"),
    ({"generator": "nope"}, "nope"),
])
def test_run_table_errors(table, message):
    with pytest.raises(CaseFileError, match=message):
        parse_run_table(table, "f.toml", "f")


def test_run_table_defaults_and_builtin_cases_load():
    from elasticbench.harness.bench.cases import load_run_case
    from elasticbench.harness.verify.matrix import builtin_case

    c = parse_run_table({}, "f.toml", "f")
    assert c.mode == "fwd" and c.baseline == "torch_softmax"
    for name in ("default", "quick", "long-rows", "two-pass-paper", "gpu"):
        case = load_run_case(builtin_case(name))
        assert case.sizes and case.dtypes
    assert max(n for _, n in load_run_case(builtin_case("long-rows")).sizes) == 1 << 22
    assert np.prod(load_run_case(builtin_case("two-pass-paper")).sizes[0]) * 4 > 32 << 20


@pytest.mark.parametrize("llc,cold", [(1 << 30, False), (1024, True)])
def test_a_unit_is_timed_with_its_backends_clock_and_waits_outside_the_span(monkeypatch, llc,
                                                                             cold):
    # a kernel may return before its work is done (a GPU's); the wait belongs to the clock's
    # stop, never inside the timed calls, and only an out-of-cache unit is flushed
    from elasticbench import devices
    from elasticbench.harness.backends import Backend
    from elasticbench.harness.bench.cases import RunCase
    from elasticbench.harness.bench.runner import Unit, measure_unit

    clock = RecordingClock(flushes=True)
    monkeypatch.setattr(Backend, "clock", lambda self: clock)
    monkeypatch.setattr(Backend, "llc_bytes", lambda self: llc)
    monkeypatch.setattr(devices, "synchronize", lambda device: clock.events.append("sync"))

    def kernel(x):
        clock.call(0)
        return x

    spec = KernelSpec("k", "softmax", "numpy", kernel)
    measure_unit(Unit(spec, "fp32", (4, 256)), RunCase("t"), POLICY, {})
    spans = _spans(clock.events)
    assert spans and all(set(span) == {"call"} for span in spans)
    assert ("flush" in clock.events) == cold
