"""`elasticbench verify`: every chosen kernel against the exact reference, in ulps."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..environment import describe
from ..execute import Isolation
from ..functions import get_function
from ..gate.shard import select_shard, shard_header
from ..inputs import get_generator
from ..interrupt import sigterm_as_interrupt
from ..numerics.dtypes import DTYPE_NAMES
from ..numerics.truth import DEFAULT_PRECISION, MIN_PRECISION
from ..numerics.truth_cache import TruthStore, default_cache_dir
from ..records import ResultsFileError, ResultsWriter, check_writable, record_key, resume_writer
from ..report.verify_table import render
from ..verify.matrix import CaseFileError, VerifyCase, expand, load_matrix
from ..verify.runner import run_verification
from .common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    case_path,
    check_survival,
    choose_kernels_by_mode,
    console,
    fail,
    kernel_options,
    split_names,
    survival_options,
)

MODE_CHOICES = ("fwd", "bwd", "both")


def _shard_key(mode_case: tuple[str, VerifyCase]) -> tuple:
    m, c = mode_case
    return (m, c.function, c.dtype, c.generator, list(c.shape), c.param_dict, c.seed)


@click.command()
@kernel_options("verify")
@click.option("--input", "inputs", multiple=True, metavar="GEN",
              help="Only these input generators (see `elasticbench list inputs`).")
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
@survival_options("case")
def verify(functions, backends, dtypes, only, inputs, kernel_files, case_file, quick, json_path,
           precision, jobs, no_cache, mode, isolate, timeout, resume_path, shard) -> None:
    """Check kernels against mpmath ground truth on adversarial inputs, in ulps.

    Exit code 0 when every case passes, 1 when any fails, 2 for bad usage or input, 130 when
    interrupted (Ctrl-C or SIGTERM: the finished records are kept; see --resume).
    Kernels run in-process by default (fastest); --isolate or --timeout runs each call in a
    child process so that a kernel that crashes or hangs becomes a failed case.
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
    shard_kn = check_survival(timeout, resume_path, json_path, shard)
    path = case_path(case_file, quick, "verify-quick", "verify")
    try:
        matrix = load_matrix(path)
    except CaseFileError as e:
        fail(str(e))
    out_path = Path(resume_path or json_path) if (resume_path or json_path) else None
    if out_path:
        try:
            check_writable(out_path)
        except OSError as e:
            fail(f"cannot write results file {out_path}: {e.strerror or e}")
    modes = ("fwd", "bwd") if mode == "both" else (mode,)
    by_mode = choose_kernels_by_mode(functions, backends, only, kernel_files, modes)
    cases_by_mode = {
        m: expand(matrix, sorted({k.function for k in ks}), dtypes or None, inputs or None)
        for m, ks in by_mode.items()
    }
    if not any(cases_by_mode.values()):
        fail(f"the matrix {path} has no case for the chosen kernels, dtypes and inputs")
    shard_doc = None
    if shard_kn:
        everything = [(m, c) for m, cases in cases_by_mode.items() for c in cases]
        mine = select_shard(everything, *shard_kn, key=_shard_key)
        shard_doc = shard_header(*shard_kn, [_shard_key(mc) for mc in everything], len(mine))
        cases_by_mode = {m: [c for mm, c in mine if mm == m] for m in cases_by_mode}

    out = console()
    err = console(stderr=True)
    meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "matrix": str(path),
            "precision": precision, **describe(include_gpu=False)}
    if shard_doc:
        meta["shard"] = shard_doc
    if resume_path:
        try:
            writer = resume_writer(Path(resume_path), "verify", meta)
        except ResultsFileError as e:
            fail(str(e))
    else:
        writer = ResultsWriter(out_path, "verify", meta)
    done = {record_key(r) for r in writer.records}
    isolation = Isolation(isolate, timeout)
    store = TruthStore(None if no_cache else default_cache_dir())
    total_records = sum(len([k for k in by_mode[m] if k.function == c.function])
                        for m, cases in cases_by_mode.items() for c in cases)
    started = time.perf_counter()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=err, transient=True,
                        disable=not err.is_terminal)
    complete = False
    try:
        with sigterm_as_interrupt(), progress:
            ref_task = progress.add_task(
                "reference (mpmath)", total=sum(len(c) for c in cases_by_mode.values()))
            rec_task = progress.add_task("kernels", total=total_records)
            for m, kernels in by_mode.items():
                run_verification(
                    kernels, cases_by_mode[m], max_elements=matrix.max_elements, store=store,
                    precision=precision, workers=jobs, mode=m, isolation=isolation, done=done,
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
    where = f"; records in {out_path}" if out_path else ""
    line = (f"{summary.cases} cases, {summary.cases - summary.failed} passed, "
            f"{summary.failed} failed in {elapsed:.1f}s{where}")
    # plain echo: a summary line is never folded, whatever the terminal's width
    if not complete:
        click.echo(f"interrupted: {line}", err=True)
        if out_path:
            click.echo(f"continue with the same options and --resume {out_path}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo(line)
    sys.exit(EXIT_FAILED if summary.failed else EXIT_OK)
