"""`elasticbench verify`: every chosen kernel against the exact reference, in ulps."""

from __future__ import annotations

import time
from pathlib import Path

import click

from elasticbench.harness.allocator import share_memory
from elasticbench.harness.cli.common import (
    case_path,
    check_survival,
    choose_kernels_by_mode,
    fail,
    failures_shown,
    kernel_options,
    note_options,
    run_session,
    split_names,
    survival_options,
)
from elasticbench.harness.environment import describe
from elasticbench.harness.execute import Isolation
from elasticbench.harness.functions import function_kind
from elasticbench.harness.kinds import Kind, VerifyOptions, kind_of
from elasticbench.harness.numerics.contract import parse_scale
from elasticbench.harness.numerics.dtypes import check_dtypes
from elasticbench.harness.numerics.truth.row_truth import DEFAULT_PRECISION, MIN_PRECISION
from elasticbench.harness.records import ResultsFileError, VerifyRecord, load_results
from elasticbench.harness.registry import KernelSpec

MODE_CHOICES = ("fwd", "bwd", "both")


@click.command()
@kernel_options("verify")
@click.option("--input", "inputs", multiple=True, metavar="GEN",
              help="Only these input generators (see `elasticbench list inputs`).")
@click.option("--case", "case_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Verification matrix ([verify] table of a TOML case file).")
@click.option("--quick", is_flag=True, help="The small matrix (cases/verify-quick.toml; "
              "attention: cases/verify-attention-quick.toml).")
@click.option("-s", "--size", "sizes", multiple=True, metavar="ROWSxN",
              help="Shapes to verify instead of the matrix's, e.g. 7x16 (attention: "
                   "BxHxLQxLKxD, e.g. 1x2x16x16x8).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="A parameter at this value instead of the matrix's grid, e.g. tau=0.5.")
@click.option("--layout", "layouts", multiple=True, metavar="L",
              help="Only inputs in these layouts: packed, padded, offset, transposed.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write every record to this results file.")
@click.option("--precision", type=int, default=DEFAULT_PRECISION, show_default=True,
              help="Bits of the mpmath reference.")
@click.option("--jobs", type=int, default=None, help="Reference worker processes [cores].")
@click.option("--no-cache", is_flag=True, help="Recompute references instead of reading the cache.")
@click.option("--one-lane", is_flag=True,
              help="Judge every kernel in this process: no second kernel lane (less memory, "
                   "more time on two cores or more).")
@click.option("--mode", "mode", default="fwd", show_default=True, metavar="fwd|bwd|both",
              help="Verify forward kernels, backward (gradient) kernels, or both.")
@click.option("--budget-scale", "budget_scale", default="1", show_default=True, metavar="X",
              help="Multiply every error budget of the run by X (X > 0).")
@survival_options("case")
@note_options
def verify(functions, backends, dtypes, only, inputs, kernel_files, case_file, quick, sizes,
           params, layouts, json_path, precision, jobs, no_cache, one_lane, mode, budget_scale,
           isolate,
           timeout, resume_path, shard, failures, traceback) -> None:
    """Check kernels against mpmath ground truth on adversarial inputs, in ulps.

    Exit code 0 when every case passes, 1 when any fails, 2 for bad usage or input, 130 when
    interrupted (Ctrl-C or SIGTERM: the finished records are kept; see --resume).
    Kernels run in-process by default (fastest); --isolate or --timeout runs each call in a
    child process so that a kernel that crashes or hangs becomes a failed case. Every failing
    case is listed, worst first, with a command that re-runs exactly it.
    """
    functions, backends, dtypes = split_names(functions), split_names(backends), split_names(dtypes)
    only, inputs = split_names(only), split_names(inputs)
    _check_options(functions, dtypes, precision, jobs, mode)
    try:
        scale = parse_scale(budget_scale)
    except ValueError as e:
        fail(str(e))
    shard_kn = check_survival(timeout, resume_path, json_path, shard)
    notes = failures_shown(failures, traceback)
    out_path = Path(resume_path or json_path) if (resume_path or json_path) else None
    modes = ("fwd", "bwd") if mode == "both" else (mode,)
    by_mode = choose_kernels_by_mode(functions, backends, only, kernel_files, modes)
    _check_resumed(resume_path, scale, [k for ks in by_mode.values() for k in ks])
    try:
        kind = kind_of(k for ks in by_mode.values() for k in ks)
    except ValueError as e:
        fail(str(e))
    fixed = parse_params(params, [k for ks in by_mode.values() for k in ks], kind)
    path = case_path(case_file, quick, kind.quick_matrix, kind.matrix)
    options = VerifyOptions(dtypes, inputs, split_names(sizes), split_names(layouts), fixed,
                            precision, jobs, no_cache, Isolation(isolate, timeout), scale,
                            lanes=not one_lane)
    try:
        job = kind.verify_job(path, by_mode, options)
    except ValueError as e:
        fail(str(e))
    builtin = None if case_file else (kind.quick_matrix if quick else kind.matrix)
    share_memory()  # four processes at once: none keeps a gigabyte it is done with
    run_session(job, out_path, _header(path, builtin, precision), shard=shard_kn,
                resume=bool(resume_path), notes=notes)


def _check_options(functions: list[str], dtypes: list[str], precision: int,
                   jobs: int | None, mode: str) -> None:
    """The options that need no kernel or matrix to check: one line and exit 2 if bad."""
    try:
        for f in functions:
            function_kind(f)
        check_dtypes(dtypes)
    except ValueError as e:
        fail(str(e))
    if precision < MIN_PRECISION:
        fail(f"--precision must be at least {MIN_PRECISION} bits, got {precision}")
    if jobs is not None and jobs < 1:
        fail(f"--jobs must be at least 1, got {jobs}")
    if mode not in MODE_CHOICES:
        fail(f"unknown --mode {mode!r} (choose from {', '.join(MODE_CHOICES)})")


def _check_resumed(resume_path: str | None, scale: float, kernels: list[KernelSpec]
                   ) -> None:
    """A resumed run keeps what its records were judged by: the budget scale, and each
    kernel's declared contract and causal convention (one line, exit 2 otherwise: a record
    judged under another declaration would be kept as if it were this one's). A file that
    cannot be read is left to the resume itself to report."""
    if not resume_path or not Path(resume_path).is_file():
        return
    try:
        records = load_results(resume_path, "verify").records
    except ResultsFileError:
        return
    records = [r for r in records if isinstance(r, VerifyRecord)]
    scales = sorted({r.budget_scale for r in records})
    if scales and scales != [scale]:
        fail(f"{resume_path} was judged at --budget-scale "
             f"{', '.join(f'{v:g}' for v in scales)}: resume it at that scale, not {scale:g}")
    declared = {k.name: k for k in kernels}
    for r in records:
        spec = declared.get(r.kernel)
        if spec is None:
            continue
        if r.accuracy != spec.accuracy:
            fail(f"{resume_path} judged {r.kernel} under accuracy={r.accuracy!r}; it declares "
                 f"{spec.accuracy!r} now: verify it into a new file")
        if r.causal is not None and r.causal != spec.causal:
            fail(f"{resume_path} judged {r.kernel} under causal={r.causal!r}; it declares "
                 f"{spec.causal!r} now: verify it into a new file")


def _header(path: Path, builtin: str | None, precision: int) -> dict:
    """The results file's header: when, which matrix (and whether built in), the machine."""
    return {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "matrix": str(path),
            "matrix_builtin": builtin, "precision": precision, **describe(include_gpu=False)}


def parse_params(values: tuple[str, ...], kernels: list[KernelSpec], kind: Kind
                 ) -> dict[str, float]:
    """--param NAME=VALUE options as {name: value}, each checked against the chosen kernels'
    functions (one line and exit 2 when no chosen function takes it or the value is bad)."""
    out: dict[str, float] = {}
    functions = [kind.function(f) for f in dict.fromkeys(k.function for k in kernels)]
    for text in values:
        name, eq, value = text.partition("=")
        name = name.strip()
        if not eq or not name:
            fail(f"--param takes NAME=VALUE, like tau=0.5; got {text!r}")
        takers = [f for f in functions if name in f.param_names]
        if not takers:
            names = ", ".join(f.name for f in functions)
            fail(f"--param {name}: no chosen function has a parameter {name!r} ({names})")
        try:
            out[name] = takers[0].validate_params({name: value})[name]
        except ValueError as e:
            fail(f"--param {name}: {e}")
    return out
