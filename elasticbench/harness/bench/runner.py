"""Running a [run] case: rooflines, quick verification, then every kernel on every shape;
the run command's job (RunJob) drives it.

Each timed (kernel, dtype, size) becomes one finished RunRecord (verdict and speedup over its
cell's baseline included) handed to on_record as soon as it is measured; the ceilings go
into the header first. Kernels are reached only through the
registry and their backend, so the core has no backend-specific branches.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from elasticbench import devices, launches
from elasticbench.harness.allocator import pin_heap
from elasticbench.harness.backends import BACKENDS, get_backend
from elasticbench.harness.bench.cases import RunCase
from elasticbench.harness.bench.models import (
    minimum_bytes,
    minimum_model,
    model_bytes,
    model_of,
    wrapped_kernel,
)
from elasticbench.harness.bench.roofline import compute_dtype, measure_copy, measure_exp, roof_for
from elasticbench.harness.bench.rotation import rotating_call
from elasticbench.harness.bench.timing import Policy, Timing, pooled, time_calls
from elasticbench.harness.execute import IN_PROCESS, Isolation, Worker
from elasticbench.harness.functions import get_function
from elasticbench.harness.inputs import generate
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.numerics.truth.cache import TruthStore, default_cache_dir
from elasticbench.harness.records import QuickVerdict, RunRecord, VerifyRecord
from elasticbench.harness.registry import MODES, KernelSpec, get_kernel, list_kernels
from elasticbench.harness.session import Job, Session
from elasticbench.harness.verify.matrix import expand, load_matrix
from elasticbench.harness.verify.verifier import run_verification
from elasticbench.settings import settings

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

def set_threads(threads: int) -> dict[str, Any]:
    """Set torch's intra-op threads and the thread variables; return what is in force."""
    n = threads or os.cpu_count() or 1
    for var in THREAD_VARIABLES:
        os.environ[var] = str(n)  # seen by libraries loaded from now on and by children
    info: dict[str, Any] = {"requested": threads or None, "threads": n,
                            "numpy": "elementwise ops single-threaded"}
    try:
        import torch

        torch.set_num_threads(n)
        info["torch"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


@dataclass
class Ceilings:
    """The machine's measured ceilings for this run."""

    device: str
    llc_bytes: int
    copy_bps: float
    exp_eps: dict[str, float]
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "llc_bytes": self.llc_bytes,
                "copy_gbps": self.copy_bps / 1e9,
                "exp_geps": {d: v / 1e9 for d, v in self.exp_eps.items()}, **self.detail}


def measure_ceilings(device: str, dtypes: list[str], policy: Policy) -> Ceilings:
    """Copy bandwidth and exp throughput for every dtype (and compute dtype) in play."""
    llc = devices.llc_bytes(device)
    copy_bps, copy_t, size = measure_copy(device, llc, policy)
    detail: dict[str, Any] = {"caches": devices.caches(device), "copy_buffer_bytes": size,
                              "copy_timing": copy_t.to_dict(), "exp_timing": {}}
    if not devices.is_cuda(device) and settings().llc_bytes is not None:
        detail["llc_from"] = devices.LLC_ENV  # not the detected cache sizes above
    rates: dict[str, float] = {}
    offered = {f"{b.name} exp+sum": probe for b in BACKENDS.values()
               if b.exp_probe is not None and b.device() == device
               and (probe := b.exp_probe()) is not None}
    for d in dict.fromkeys([*dtypes, *(compute_dtype(d) for d in dtypes), "fp64"]):
        rates[d], t = measure_exp(device, d, policy, offered)
        detail["exp_timing"][d] = t.to_dict()
    return Ceilings(device, llc, copy_bps, rates, detail)


def verify_quickly(kernels: list[KernelSpec], case: RunCase, dtypes: list[str],
                   store: TruthStore, on_done: Callable[[], None] = lambda: None,
                   isolation: Isolation = IN_PROCESS
                   ) -> dict[tuple[str, str], QuickVerdict]:
    """(kernel, dtype) -> verdict on the case's quick matrix, forward and backward kernels
    each by their own verifier."""
    verdicts: dict[tuple[str, str], QuickVerdict] = {}
    if not kernels:
        return verdicts
    matrix = load_matrix(case.verify_path())

    def add(r: VerifyRecord) -> None:
        v = verdicts.setdefault((r.kernel, r.dtype), QuickVerdict(
            status="pass", cases=0, failed=0, max_ulp=0.0))
        v.cases = (v.cases or 0) + 1
        if r.max_ulp is not None and not math.isnan(r.max_ulp):
            v.max_ulp = max(v.max_ulp or 0.0, r.max_ulp)
        if not r.passed:
            v.failed = (v.failed or 0) + 1
            v.status = "FAIL"
            v.reason = v.reason or f"{r.reason} ({r.input} {list(r.shape)} {r.params})"
        on_done()

    for mode in MODES:
        chosen = [k for k in kernels if k.mode == mode]
        if not chosen:
            continue
        cases = expand(matrix, sorted({k.function for k in chosen}), dtypes,
                       list(case.verify_inputs) or None)
        run_verification(chosen, cases, max_elements=matrix.max_elements, store=store,
                         on_record=add, mode=mode, isolation=isolation,
                         max_rows=matrix.max_rows)
    for k in kernels:
        for d in dtypes:
            verdicts.setdefault((k.name, d), QuickVerdict(status="unverified", cases=0, failed=0,
                                                          reason="no case in matrix"))
    return verdicts


@dataclass
class Unit:
    """One timed cell: a kernel on a dtype and a size."""

    spec: KernelSpec
    dtype: str
    shape: tuple[int, int]
    baseline: bool = False
    position: int = 0  # place in the whole plan: shards and resumed runs keep the order

    @property
    def key(self) -> tuple:
        """What a record of this unit is a result for (its RunRecord.unit)."""
        return (self.spec.name, self.spec.mode, self.dtype, tuple(self.shape))

    @property
    def cell(self) -> tuple:
        """The cell it competes in, with the baseline timed there (its RunRecord.cell)."""
        return (self.dtype, tuple(self.shape), self.spec.mode)


def plan_units(kernels: list[KernelSpec], baseline: KernelSpec | None, case: RunCase,
               dtypes: list[str], sizes: list[tuple[int, int]]) -> list[Unit]:
    """The baseline first at each (dtype, size), then every chosen kernel that takes dtype."""
    units = []
    for d in dtypes:
        for shape in sizes:
            if baseline is not None and baseline.supports(d):
                units.append(Unit(baseline, d, shape, True))
            units += [Unit(k, d, shape) for k in kernels if k is not baseline and k.supports(d)]
    for i, u in enumerate(units):
        u.position = i
    return units


def _inputs(spec: KernelSpec, dtype: str, shape: tuple[int, int], generator: str, seed: int,
            params: dict[str, float]) -> tuple[np.ndarray, ...]:
    """The NumPy arguments of one call: (x,) forward, (x, y, g) backward."""
    x = generate(generator, dtype, shape, seed)
    if spec.mode == "fwd":
        return (x,)
    fwd = list_kernels(spec.function, "numpy", "fwd")
    if not fwd:
        raise ValueError(f"no numpy forward kernel of {spec.function} to make y for backward")
    y = fwd[0].fn(x, **params)
    g = generate("normal", dtype, shape, seed + 1)
    return (x, y, g)


@dataclass
class Measurement:
    """What timing one unit in one process gave: the timing and how its inputs were laid."""

    timing: Timing
    copies: int
    footprint: int
    launch: str | None = None  # what the kernel's calls launched (elasticbench.launches)

    @property
    def out_of_cache(self) -> bool:
        return self.copies > 1


def measure_unit(unit: Unit, case: RunCase, policy: Policy,
                 params: dict[str, float]) -> Measurement:
    """Time one unit in this process, out of cache when its data exceed half the LLC."""
    spec = unit.spec
    args = _inputs(spec, unit.dtype, unit.shape, case.generator, case.seed, params)
    footprint = minimum_bytes(*unit.shape, get_format(unit.dtype).itemsize, spec.mode)
    call = rotating_call(spec, args, params, footprint)
    copies = call.copies
    with launches.noting() as notes:
        timing = time_calls(call, policy, get_backend(spec.backend).clock(),
                            cold=call.out_of_cache)
    call.release()  # free the rotated copies before the next unit
    return Measurement(timing, copies, footprint, launches.summary(notes))


def unit_record(unit: Unit, case: RunCase, ceilings: Ceilings, params: dict[str, float],
                m: Measurement) -> RunRecord:
    """The record of a measured unit (run_units adds the verdict and the speedup)."""
    spec, (rows, n) = unit.spec, unit.shape
    itemsize = get_format(unit.dtype).itemsize
    min_bytes = minimum_bytes(rows, n, itemsize, spec.mode)
    seconds = m.timing.stats.median_ns * 1e-9
    model, minimum = model_of(spec), minimum_model(spec.function, spec.mode)
    cdt = model.compute or compute_dtype(unit.dtype)
    roof = roof_for(model, minimum, itemsize, ceilings.copy_bps, ceilings.exp_eps[cdt])
    eps = rows * n / seconds
    return RunRecord(
        kernel=spec.name, function=spec.function, backend=spec.backend, source=spec.source,
        mode=spec.mode, baseline=unit.baseline, dtype=unit.dtype, compute_dtype=cdt,
        shape=(rows, n), params=params, generator=case.generator, seed=case.seed,
        cache="out-of-cache" if m.out_of_cache else "in-cache",
        footprint_bytes=m.footprint, rotated_buffers=m.copies, model=model.to_dict(),
        min_bytes=min_bytes, model_bytes=model_bytes(model, rows, n, itemsize),
        timing=m.timing.to_record(), median_s=seconds, elements_per_s=eps,
        gbps=min_bytes / seconds / 1e9, pct_copy=100 * min_bytes / seconds / ceilings.copy_bps,
        roof=roof.to_dict(), binding=roof.binding, pct_roof=100 * eps / roof.roof_eps,
        launch=m.launch,
    )


def resolve_baseline(case: RunCase, mode: str) -> KernelSpec | None:
    """The case's baseline kernel for this mode (torch_softmax is both torch.softmax and its
    backward), or None when it names none or none is registered here."""
    if not case.baseline:
        return None
    try:
        return get_kernel(case.baseline, mode)
    except ValueError:
        return None


def params_for(case: RunCase, function: str) -> dict[str, float]:
    return case.params.get(function) or get_function(function).defaults()


class BaselineTimes:
    """The baseline's median time in each cell, learnt from records as they are made; a
    record's speedup is that over its own (the plan times each cell's baseline first)."""

    def __init__(self, records: Iterable[RunRecord] = ()):
        self._median: dict[tuple, float] = {}
        for r in records:
            self.learn(r)

    def learn(self, record: RunRecord) -> None:
        if record.baseline and record.median_s:
            self._median[record.cell] = record.median_s

    def speedup(self, record: RunRecord) -> float | None:
        """Baseline median over the record's, for a ranked record or the baseline itself."""
        base = self._median.get(record.cell)
        ok = record.median_s and (record.ranked or record.baseline)
        return base / record.median_s if ok and base else None


def run_units(
    case: RunCase,
    units: list[Unit],
    ceilings: Ceilings,
    verdicts: dict[tuple[str, str], QuickVerdict],
    *,
    earlier: Iterable[RunRecord] = (),
    policy: Policy | None = None,
    isolation: Isolation = IN_PROCESS,
    on_start: Callable[[Unit], None] = lambda u: None,
    on_measured: Callable[[], None] = lambda: None,
    on_record: Callable[[RunRecord], None] = lambda r: None,
) -> list[RunRecord]:
    """Time the given units in order (a whole plan, a shard of it, or what a resumed run
    has left, whose `earlier` records hold the baselines already timed). Each record is
    finished before it is handed on: its verdict, its plan position, the copy bandwidth it
    was measured against and its speedup over its cell's baseline.

    With policy.processes = P > 1, the units are timed in P passes, each in a fresh worker
    process, so the P processes of one unit are a pass apart, not back to back; a unit's
    record is made in the last pass, its samples kept per process. On an interrupt, the
    units measured by at least one process get their record before the interrupt goes on."""
    policy = policy or case.timing
    passes, per_process = policy.processes, policy.per_process()
    baselines = BaselineTimes(earlier)
    measured: dict[int, list[Measurement]] = {}
    failed: dict[int, str] = {}
    records: list[RunRecord] = []

    def finish(i: int) -> None:
        unit, params = units[i], params_for(case, units[i].spec.function)
        if i in failed:
            rec = _error_record(unit, params, failed[i])
        else:
            ms = measured[i]
            rec = unit_record(unit, case, ceilings, params,
                              replace(ms[-1], timing=pooled([m.timing for m in ms])))
        verdict = verdicts.get((unit.spec.name, unit.dtype),
                               QuickVerdict(status="unverified", reason="not verified"))
        rec.verify, rec.baseline, rec.plan_position = verdict, unit.baseline, unit.position
        rec.wraps = wrapped_kernel(unit.spec)
        rec.copy_gbps = ceilings.copy_bps / 1e9
        rec.ranked = rec.error is None and verdict.status == "pass" and not unit.baseline
        baselines.learn(rec)
        rec.speedup = baselines.speedup(rec)
        records.append(rec)
        on_record(rec)

    try:
        for p in range(passes):
            _one_pass(units, case, per_process, passes > 1, isolation, measured, failed,
                      on_start, on_measured, finish if p == passes - 1 else None)
    except KeyboardInterrupt:
        done = {r.plan_position for r in records}
        for i, unit in enumerate(units):
            if unit.position not in done and (i in measured or i in failed):
                finish(i)
        raise
    return records


def _one_pass(units: list[Unit], case: RunCase, policy: Policy, fresh: bool,
              isolation: Isolation, measured: dict[int, list[Measurement]],
              failed: dict[int, str], on_start: Callable[[Unit], None],
              on_measured: Callable[[], None], finish: Callable[[int], None] | None) -> None:
    """One pass over the units (in one fresh worker process when `fresh`): each unit that
    has not failed measured once more, into measured or failed; finish(i) after each unit
    when given (the last pass)."""
    worker = Worker() if fresh else None
    try:
        for i, unit in enumerate(units):
            on_start(unit)
            if i not in failed:
                params = params_for(case, unit.spec.function)
                call = partial(_measure_or_error, unit, case, policy, params,
                               case.threads if worker else None)
                got = (worker.call(call, isolation.timeout, _failure) if worker
                       else isolation.run(call, _failure))
                if isinstance(got, str):
                    failed[i] = got
                else:
                    measured.setdefault(i, []).append(got)
            on_measured()
            if finish is not None:
                finish(i)
    finally:
        if worker is not None:
            worker.stop()


def _failure(why: str, seconds: float = 0.0) -> str:
    return why


def _error_record(unit: Unit, params: dict, why: str) -> RunRecord:
    return RunRecord(kernel=unit.spec.name, function=unit.spec.function,
                     backend=unit.spec.backend, source=unit.spec.source, mode=unit.spec.mode,
                     dtype=unit.dtype, shape=unit.shape, params=params, error=why)


def _measure_or_error(unit: Unit, case: RunCase, policy: Policy, params: dict[str, float],
                      threads: int | None) -> Measurement | str:
    """measure_unit, or why the kernel could not run. In a fresh worker (threads given) the
    process is first set up as the run's own: its threads and its heap."""
    if threads is not None:
        set_threads(threads)
        pin_heap()
    try:
        return measure_unit(unit, case, policy, params)
    except Exception as e:  # a kernel that cannot run is a result, not a crash
        return f"raised {type(e).__name__}: {e}".splitlines()[0]


class RunJob(Job[Unit]):
    """Time planned units (see plan_units) on a device against its measured ceilings."""

    kind = "run"

    def __init__(self, case: RunCase, units: list[Unit], dtypes: list[str], device: str,
                 isolation: Isolation):
        self.case, self.units, self.dtypes = case, units, dtypes
        self.device, self.isolation = device, isolation

    def plan(self) -> list[Unit]:
        return self.units

    def shard_key(self, unit: Unit) -> Any:
        return unit.cell  # a shard holds whole cells: each record's baseline is timed with it

    def work(self, units: list[Unit], session: Session) -> None:
        done = {r.unit for r in session.records}
        units = [u for u in units if u.key not in done]
        case = self.case
        timed = list({id(u.spec): u.spec for u in units}.values())
        task = session.task(f"{case.name} · ceilings", len(units) * case.timing.processes + 2)
        ceilings = measure_ceilings(self.device, self.dtypes, case.timing)
        session.header["ceilings"] = ceilings.to_dict()
        task.advance()
        task.describe(f"{case.name} · quick verification")
        verdicts = verify_quickly(timed, case, self.dtypes, TruthStore(default_cache_dir()),
                                  isolation=self.isolation)
        session.header["verification"] = {f"{k}/{d}": v.to_dict()
                                           for (k, d), v in verdicts.items()}
        task.advance()
        run_units(case, units, ceilings, verdicts, earlier=list(session.records),
                  isolation=self.isolation,
                  on_start=lambda u: task.describe(
                      f"{case.name} · {u.spec.name} · {u.shape[0]}x{u.shape[1]} {u.dtype}"),
                  on_measured=task.advance, on_record=session.add)
