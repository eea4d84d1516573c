"""`elasticbench run`: time kernels over a case matrix against the machine's measured roofs."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import click

from .. import devices
from ..backends import device_of
from ..bench.attention import AttentionRunJob
from ..bench.attention_case import TABLE as ATTENTION_TABLE
from ..bench.attention_case import load_attention_run
from ..bench.cases import load_run_case, parse_size
from ..bench.job import RunJob
from ..bench.runner import pin_heap, plan_units, resolve_baseline, set_threads
from ..environment import describe
from ..execute import Isolation
from ..functions import get_function
from ..numerics.dtypes import check_dtypes
from ..registry import get_kernel, list_kernels
from ..verify.matrix import CaseFileError, read_toml
from .common import (
    case_path,
    check_survival,
    choose_kernels,
    fail,
    kernel_options,
    run_session,
    split_names,
    survival_options,
)


@click.command()
@click.option("--case", "case_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Case file with a [run] table [cases/default.toml].")
@click.option("--quick", is_flag=True, help="The CI case (cases/quick.toml, about 20 s).")
@kernel_options("time")
@click.option("-s", "--size", "sizes", multiple=True, metavar="ROWSxN",
              help="Shapes to time instead of the case's, e.g. 64x262144.")
@click.option("--mode", type=click.Choice(["fwd", "bwd"]), default=None,
              help="Forward or backward kernels [the case's, else fwd].")
@click.option("--processes", type=click.IntRange(min=1), default=None, metavar="N",
              help="Time each cell in N fresh processes, in N passes over the plan, so a "
                   "gate sees the spread between processes [the case's run.timing.processes]."
              )
@click.option("--json", "json_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Results file [results/runs/<timestamp>.json].")
@survival_options("cell")
def run(case_file, quick, functions, backends, dtypes, sizes, mode, only, kernel_files,
        processes, json_path, shard, isolate, timeout, resume_path) -> None:
    """Time kernels and compare them with the copy-bandwidth and exp-throughput roofs.

    Every kernel is verified quickly first; a failing kernel is marked and never ranked.
    Exit code 0 when every timed kernel passed, 1 when any failed, 2 for bad usage.
    """
    functions, backends, dtypes = split_names(functions), split_names(backends), split_names(dtypes)
    only = split_names(only)
    try:
        for f in functions:
            get_function(f)
        check_dtypes(dtypes)
        shapes = [parse_size(s) for s in split_names(sizes)]
    except ValueError as e:
        fail(str(e))
    shard_kn = check_survival(timeout, resume_path, json_path, shard)
    path = case_path(case_file, quick, "quick", "default")
    if case_file and ATTENTION_TABLE in _tables(path):
        _run_attention(path, json_path, resume_path, shard_kn)
    try:
        case = load_run_case(path)
    except CaseFileError as e:
        fail(str(e))
    mode = mode or case.mode
    if processes is not None:
        case = replace(case, timing=replace(case.timing, processes=processes))
    if mode == "bwd" and not kernel_files and not list_kernels(mode="bwd"):
        fail("no backward kernels are registered yet (register one with mode=\"bwd\": "
             "fn(x, y, g, *, params) -> (dx, dparams...)), or pass --kernel-file")
    out_path = Path(resume_path or json_path) if (resume_path or json_path) else (
        Path("results") / "runs" / f"{time.strftime('%Y%m%dT%H%M%S')}.json")
    kernels = choose_kernels(functions or list(case.functions), backends or list(case.backends),
                             only or list(case.kernels), kernel_files, mode)
    if not only and not kernel_files:
        kernels = [k for k in kernels if k.name not in case.exclude]
    baseline = resolve_baseline(case, mode)
    kernels = [k for k in kernels if baseline is None or k.name != baseline.name]
    if not kernels and baseline is None:
        fail("no kernel left to time after the case's exclusions")
    dtypes = dtypes or list(case.dtypes)
    shapes = shapes or list(case.sizes)

    threads = set_threads(case.threads)
    allocator = pin_heap()
    device = device_of([k.backend for k in kernels + ([baseline] if baseline else [])])
    try:
        devices.llc_bytes(device)  # a bad ELASTICBENCH_LLC_BYTES: one line, before any work
    except ValueError as e:
        fail(str(e))
    meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "case": str(path),
            "case_name": case.name, "mode": mode, "seed": case.seed, "threads": threads,
            "allocator": allocator, "dtypes": dtypes, "sizes": [list(s) for s in shapes],
            "baseline": baseline.name if baseline else None,
            "policy": case.timing.__dict__, **describe()}
    job = RunJob(case, plan_units(kernels, baseline, case, dtypes, shapes), dtypes, device,
                 Isolation(isolate, timeout))
    run_session(job, out_path, meta, shard=shard_kn, resume=bool(resume_path))


def _tables(path: Path) -> set[str]:
    try:
        return set(read_toml(path))
    except CaseFileError as e:
        fail(str(e))


def _run_attention(path: Path, json_path: str | None, resume_path: str | None,
                   shard_kn: tuple[int, int] | None) -> None:
    """run for an [attention_run] case (docs/attention.md section 6): attention kernels
    against SDPA, the copy and matmul ceilings, peak memory; the same session and records."""
    try:
        case = load_attention_run(path)
    except CaseFileError as e:
        fail(str(e))
    threads = set_threads(0)
    out_path = Path(resume_path or json_path) if (resume_path or json_path) else (
        Path("results") / "runs" / f"{time.strftime('%Y%m%dT%H%M%S')}.json")
    specs = [get_kernel(n, m) for n in (*case.kernels, *filter(None, [case.baseline]))
             for m in case.modes]
    device = device_of([s.backend for s in specs])
    meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "case": str(path),
            "case_name": case.name, "mode": ",".join(case.modes), "seed": case.seed,
            "threads": threads, "dtypes": list(case.dtypes),
            "sizes": [[case.batch, case.heads, n, n, case.head_dim] for n in case.lengths],
            "baseline": case.baseline, "policy": case.timing.__dict__, **describe()}
    run_session(AttentionRunJob(case, device), out_path, meta, shard=shard_kn,
                resume=bool(resume_path))
