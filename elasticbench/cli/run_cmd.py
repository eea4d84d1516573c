"""`elasticbench run`: time kernels over a case matrix against the machine's measured roofs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..bench.cases import load_run_case, parse_size
from ..bench.runner import (
    apply_speedups,
    measure_ceilings,
    pin_heap,
    plan_units,
    record_unit_key,
    resolve_baseline,
    run_units,
    set_threads,
    verify_quickly,
)
from ..bench.table import render_run
from ..environment import describe
from ..execute import Isolation
from ..functions import get_function
from ..gate.shard import select_shard, shard_header
from ..interrupt import sigterm_as_interrupt
from ..numerics.dtypes import DTYPE_NAMES
from ..numerics.truth_cache import TruthStore, default_cache_dir
from ..records import ResultsFileError, ResultsWriter, check_writable, resume_writer
from ..registry import list_kernels
from ..verify.matrix import CaseFileError
from .common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    case_path,
    check_survival,
    choose_kernels,
    console,
    fail,
    kernel_options,
    split_names,
    survival_options,
)


def _device_of(kernels) -> str:
    """Where the timed kernels' arrays live: probed through their backends, not by name."""
    import numpy as np

    from ..backends import get_backend

    for k in kernels:
        native = get_backend(k.backend).to_native(np.zeros((1, 1), np.float32))
        if getattr(native, "is_cuda", False):
            return str(native.device)
    return "cpu"


@click.command()
@click.option("--case", "case_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Case file with a [run] table [cases/default.toml].")
@click.option("--quick", is_flag=True, help="The CI case (cases/quick.toml, about 20 s).")
@kernel_options("time")
@click.option("-s", "--size", "sizes", multiple=True, metavar="ROWSxN",
              help="Shapes to time instead of the case's, e.g. 64x262144.")
@click.option("--mode", type=click.Choice(["fwd", "bwd"]), default=None,
              help="Forward or backward kernels [the case's, else fwd].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Results file [results/runs/<timestamp>.json].")
@survival_options("cell")
def run(case_file, quick, functions, backends, dtypes, sizes, mode, only, kernel_files,
        json_path, shard, isolate, timeout, resume_path) -> None:
    """Time kernels and compare them with the copy-bandwidth and exp-throughput roofs.

    Every kernel is verified quickly first; a failing kernel is marked and never ranked.
    Exit code 0 when every timed kernel passed, 1 when any failed, 2 for bad usage.
    """
    functions, backends, dtypes = split_names(functions), split_names(backends), split_names(dtypes)
    only = split_names(only)
    try:
        for f in functions:
            get_function(f)
        for d in dtypes:
            if d not in DTYPE_NAMES:
                raise ValueError(f"unknown dtype {d!r} (choose from {', '.join(DTYPE_NAMES)})")
        shapes = [parse_size(s) for s in split_names(sizes)]
    except ValueError as e:
        fail(str(e))
    shard_kn = check_survival(timeout, resume_path, json_path, shard)
    path = case_path(case_file, quick, "quick", "default")
    try:
        case = load_run_case(path)
    except CaseFileError as e:
        fail(str(e))
    mode = mode or case.mode
    if mode == "bwd" and not kernel_files and not list_kernels(mode="bwd"):
        fail("no backward kernels are registered yet (register one with mode=\"bwd\": "
             "fn(x, y, g, *, params) -> (dx, dparams...)), or pass --kernel-file")
    out_path = Path(resume_path or json_path) if (resume_path or json_path) else (
        Path("results") / "runs" / f"{time.strftime('%Y%m%dT%H%M%S')}.json")
    try:
        check_writable(out_path)
    except OSError as e:
        fail(f"cannot write results file {out_path}: {e.strerror or e}")
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

    out, err = console(), console(stderr=True)
    threads = set_threads(case.threads)
    allocator = pin_heap()
    device = _device_of(kernels + ([baseline] if baseline else []))
    meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "case": str(path),
            "case_name": case.name, "mode": mode, "seed": case.seed, "threads": threads,
            "allocator": allocator, "dtypes": dtypes, "sizes": [list(s) for s in shapes],
            "baseline": baseline.name if baseline else None,
            "policy": case.timing.__dict__, **describe()}
    units = plan_units(kernels, baseline, case, dtypes, shapes)
    if shard_kn:
        mine = select_shard(units, *shard_kn, key=lambda u: u.key)
        meta["shard"] = shard_header(*shard_kn, [u.key for u in units], len(mine))
        units = mine
    if resume_path:
        try:
            writer = resume_writer(out_path, "run", meta)
        except ResultsFileError as e:
            fail(str(e))
        done = {record_unit_key(r) for r in writer.records}
        units = [u for u in units if u.key not in done]
    else:
        writer = ResultsWriter(out_path, "run", meta)
    started = time.perf_counter()
    timed = [k for k in kernels + ([baseline] if baseline else [])
             if any(u.spec is k for u in units)]
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=err, transient=True,
                        disable=not err.is_terminal)
    isolation = Isolation(isolate, timeout)
    complete = False
    try:
        with sigterm_as_interrupt(), progress:
            task = progress.add_task(f"{case.name} · ceilings", total=len(units) + 2)
            ceilings = measure_ceilings(device, dtypes, case.timing)
            writer.doc["ceilings"] = ceilings.to_dict()
            progress.update(task, advance=1, description=f"{case.name} · quick verification")
            verdicts = verify_quickly(timed, case, dtypes, TruthStore(default_cache_dir()),
                                      isolation=isolation)
            writer.doc["verification"] = {f"{k}/{d}": v for (k, d), v in verdicts.items()}
            progress.advance(task)
            on_start = lambda u: progress.update(  # noqa: E731
                task, description=f"{case.name} · {u.spec.name} · "
                                  f"{u.shape[0]}x{u.shape[1]} {u.dtype}")
            on_record = lambda r: (writer.add(r), progress.advance(task))  # noqa: E731
            run_units(case, units, ceilings, verdicts, isolation=isolation,
                      on_start=on_start, on_record=on_record)
        complete = True
    except KeyboardInterrupt:
        pass
    finally:
        apply_speedups(writer.records)
        writer.doc["elapsed_s"] = time.perf_counter() - started
        writer.close(complete=complete)
    render_run(writer.records, writer.doc.get("ceilings"), out)
    bad = [r for r in writer.records if not r.get("baseline")
           and ("error" in r or r["verify"].get("status") == "FAIL")]
    line = (f"{len(writer.records)} timings of {len(timed)} kernels in "
            f"{time.perf_counter() - started:.1f}s; records in {out_path}")
    # plain echo: a summary line is never folded, whatever the terminal's width
    if not complete:
        click.echo(f"interrupted: {line}", err=True)
        click.echo(f"continue with the same options and --resume {out_path}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo(line + (f"; {len(bad)} failed verification or raised" if bad else ""))
    sys.exit(EXIT_FAILED if bad else EXIT_OK)
