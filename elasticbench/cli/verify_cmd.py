"""`elasticbench verify`: every chosen kernel against the exact reference, in ulps."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..environment import describe
from ..functions import get_function
from ..inputs import get_generator
from ..numerics.dtypes import DTYPE_NAMES
from ..numerics.truth import DEFAULT_PRECISION, MIN_PRECISION
from ..numerics.truth_cache import TruthStore, default_cache_dir
from ..records import ResultsWriter, check_writable
from ..report.verify_table import render
from ..verify.matrix import CaseFileError, builtin_case, expand, load_matrix
from ..verify.runner import run_verification
from .common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    choose_kernels_by_mode,
    console,
    fail,
    split_names,
)

MODE_CHOICES = ("fwd", "bwd", "both")


@click.command()
@click.option("-f", "--function", "functions", multiple=True, metavar="F",
              help="Only kernels of this function (repeat or comma-separate).")
@click.option("-b", "--backend", "backends", multiple=True, metavar="B",
              help="Only kernels of this backend: numpy, torch.")
@click.option("-d", "--dtype", "dtypes", multiple=True, metavar="D",
              help=f"Only these dtypes: {', '.join(DTYPE_NAMES)}.")
@click.option("--only", "only", multiple=True, metavar="NAME,...", help="Only these kernels.")
@click.option("--input", "inputs", multiple=True, metavar="GEN",
              help="Only these input generators (see `elasticbench list inputs`).")
@click.option("--kernel-file", "kernel_files", multiple=True,
              type=click.Path(dir_okay=False), metavar="PATH",
              help="Load kernels from a Python file; without --only, verify just those.")
@click.option("--case", "case_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Verification matrix ([verify] table of a TOML case file).")
@click.option("--quick", is_flag=True, help="The small matrix (cases/verify-quick.toml).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write every record to this results file.")
@click.option("--precision", type=int, default=DEFAULT_PRECISION, show_default=True,
              help="Bits of the mpmath reference.")
@click.option("--jobs", type=int, default=None, help="Reference worker processes [cores].")
@click.option("--no-cache", is_flag=True, help="Recompute references instead of reading the cache.")
@click.option("--mode", "mode", default="fwd", show_default=True, metavar="fwd|bwd|both",
              help="Verify forward kernels, backward (gradient) kernels, or both.")
def verify(functions, backends, dtypes, only, inputs, kernel_files, case_file, quick, json_path,
           precision, jobs, no_cache, mode) -> None:
    """Check kernels against mpmath ground truth on adversarial inputs, in ulps.

    Exit code 0 when every case passes, 1 when any fails, 2 for bad usage or input.
    """
    functions, backends, dtypes = split_names(functions), split_names(backends), split_names(dtypes)
    only, inputs = split_names(only), split_names(inputs)
    try:
        for f in functions:
            get_function(f)
        for g in inputs:
            get_generator(g)
        for d in dtypes:
            if d not in DTYPE_NAMES:
                raise ValueError(f"unknown dtype {d!r} (choose from {', '.join(DTYPE_NAMES)})")
    except ValueError as e:
        fail(str(e))
    if precision < MIN_PRECISION:
        fail(f"--precision must be at least {MIN_PRECISION} bits, got {precision}")
    if jobs is not None and jobs < 1:
        fail(f"--jobs must be at least 1, got {jobs}")
    if mode not in MODE_CHOICES:
        fail(f"unknown --mode {mode!r} (choose from {', '.join(MODE_CHOICES)})")
    if case_file and quick:
        fail("--case and --quick cannot be used together")
    path = Path(case_file) if case_file else builtin_case("verify-quick" if quick else "verify")
    try:
        matrix = load_matrix(path)
    except CaseFileError as e:
        fail(str(e))
    if json_path:
        try:
            check_writable(Path(json_path))
        except OSError as e:
            fail(f"cannot write results file {json_path}: {e.strerror or e}")
    modes = ("fwd", "bwd") if mode == "both" else (mode,)
    by_mode = choose_kernels_by_mode(functions, backends, only, kernel_files, modes)
    cases_by_mode = {
        m: expand(matrix, sorted({k.function for k in ks}), dtypes or None, inputs or None)
        for m, ks in by_mode.items()
    }
    if not any(cases_by_mode.values()):
        fail(f"the matrix {path} has no case for the chosen kernels, dtypes and inputs")

    out = console()
    err = console(stderr=True)
    meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "matrix": str(path),
            "precision": precision, **describe(include_gpu=False)}
    writer = ResultsWriter(Path(json_path) if json_path else None, "verify", meta)
    store = TruthStore(None if no_cache else default_cache_dir())
    total_records = sum(len([k for k in by_mode[m] if k.function == c.function])
                        for m, cases in cases_by_mode.items() for c in cases)
    started = time.perf_counter()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=err, transient=True,
                        disable=not err.is_terminal)
    complete = False
    try:
        with progress:
            ref_task = progress.add_task(
                "reference (mpmath)", total=sum(len(c) for c in cases_by_mode.values()))
            rec_task = progress.add_task("kernels", total=total_records)
            for m, kernels in by_mode.items():
                run_verification(
                    kernels, cases_by_mode[m], max_elements=matrix.max_elements, store=store,
                    precision=precision, workers=jobs, mode=m,
                    on_truth=lambda k: progress.advance(ref_task, k),
                    on_record=lambda r: (writer.add(r), progress.advance(rec_task)),
                )
        complete = True
    except KeyboardInterrupt:
        pass
    finally:
        writer.doc["elapsed_s"] = time.perf_counter() - started
        writer.close(complete=complete)
    summary = render(writer.records, out)
    elapsed = time.perf_counter() - started
    where = f"; records in {json_path}" if json_path else ""
    line = (f"{summary.cases} cases, {summary.cases - summary.failed} passed, "
            f"{summary.failed} failed in {elapsed:.1f}s{where}")
    if not complete:
        err.print(f"interrupted: {line}")
        sys.exit(EXIT_INTERRUPTED)
    out.print(line)
    sys.exit(EXIT_FAILED if summary.failed else EXIT_OK)
