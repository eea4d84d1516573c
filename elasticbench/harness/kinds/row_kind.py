"""Row kernels (the exp family on rows): the [verify] matrix, ROWSxN sizes, layouts, the
[run] case timed against the copy and exp ceilings."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from elasticbench.harness.allocator import pin_heap
from elasticbench.harness.backends import device_of
from elasticbench.harness.bench.cases import RunCase, load_run_case, parse_size
from elasticbench.harness.bench.runner import RunJob, plan_units, resolve_baseline, set_threads
from elasticbench.harness.environment import describe
from elasticbench.harness.functions import ROW, Function, get_function
from elasticbench.harness.inputs import get_generator
from elasticbench.harness.inputs.layouts import check_layout
from elasticbench.harness.kinds.kind import Kind, RunOptions, VerifyOptions, no_cases
from elasticbench.harness.numerics.truth.cache import TruthStore, default_cache_dir
from elasticbench.harness.registry import KernelSpec, list_kernels
from elasticbench.harness.selftest.mutants import MUTANTS
from elasticbench.harness.selftest.outcomes import SelftestOutcome, run_selftest
from elasticbench.harness.verify.matrix import builtin_case, expand, load_matrix
from elasticbench.harness.verify.verifier import VerifyJob


class Rows(Kind):
    """Kernels that take one array of rows (registry.py's row contract)."""

    name = ROW
    matrix, quick_matrix, run_table = "verify", "verify-quick", "run"

    def function(self, name: str) -> Function:
        return get_function(name)

    def verify_job(self, path: Path, kernels: dict[str, list[KernelSpec]],
                   options: VerifyOptions) -> VerifyJob:
        shapes = [parse_size(v) for v in options.sizes]
        layouts = [check_layout(v) for v in options.layouts]
        matrix = load_matrix(path)
        named = {spec.generator for spec in matrix.inputs if spec.explicit is not None}
        for g in options.inputs:
            if g not in named:
                get_generator(g)
        cases = {m: [c for c in expand(matrix, sorted({k.function for k in ks}),
                                       options.dtypes or None, options.inputs or None,
                                       shapes or None, options.params)
                     if not layouts or c.layout in layouts]
                 for m, ks in kernels.items()}
        if not any(cases.values()):
            raise no_cases(path)
        store = TruthStore(None if options.no_cache else default_cache_dir())
        return VerifyJob(kernels, cases, max_elements=matrix.max_elements, store=store,
                         precision=options.precision, workers=options.jobs,
                         isolation=options.isolation, max_rows=matrix.max_rows,
                         scale=options.scale, lanes=options.lanes)

    def run_job(self, path: Path, options: RunOptions) -> tuple[RunJob, dict[str, Any]]:
        for f in options.functions:
            get_function(f)
        shapes = [parse_size(s) for s in options.sizes]
        case = load_run_case(path)
        mode = options.mode or case.mode
        if options.processes is not None:
            case = replace(case, timing=replace(case.timing, processes=options.processes))
        if mode == "bwd" and not options.kernel_files and not list_kernels(mode="bwd"):
            raise ValueError("no backward kernels are registered yet (register one with "
                             "mode=\"bwd\": fn(x, y, g, *, params) -> (dx, dparams...)), or "
                             "pass --kernel-file")
        kernels, baseline = _run_kernels(case, options, mode)
        dtypes = options.dtypes or list(case.dtypes)
        shapes = shapes or list(case.sizes)
        threads = set_threads(case.threads)
        allocator = pin_heap()
        device = device_of([k.backend for k in kernels + ([baseline] if baseline else [])])
        meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "case": str(path),
                "case_name": case.name, "mode": mode, "seed": case.seed, "threads": threads,
                "allocator": allocator, "dtypes": dtypes, "sizes": [list(s) for s in shapes],
                "baseline": baseline.name if baseline else None,
                "policy": case.timing.__dict__, **describe()}
        job = RunJob(case, plan_units(kernels, baseline, case, dtypes, shapes), dtypes, device,
                     options.isolation)
        return job, meta


    def selftest(self, correct: list[KernelSpec], cache: Path | None) -> list[SelftestOutcome]:
        return run_selftest(MUTANTS, correct, load_matrix(builtin_case(self.quick_matrix)),
                            TruthStore(cache))


def _run_kernels(case: RunCase, options: RunOptions, mode: str
                 ) -> tuple[list[KernelSpec], KernelSpec | None]:
    """The kernels a run times (the options', else the case's, less its exclusions) and the
    baseline they are timed against."""
    kernels = options.choose(options.functions or list(case.functions),
                             options.backends or list(case.backends),
                             options.only or list(case.kernels), options.kernel_files, mode)
    if not options.only and not options.kernel_files:
        kernels = [k for k in kernels if k.name not in case.exclude]
    baseline = resolve_baseline(case, mode)
    kernels = [k for k in kernels if baseline is None or k.name != baseline.name]
    if not kernels and baseline is None:
        raise ValueError("no kernel left to time after the case's exclusions")
    return kernels, baseline


ROWS = Rows()
