"""`elasticbench hunt`: search for an input that breaks a kernel within a time budget, shrink
it, and save it as a case file that `verify --case` replays."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import click

from elasticbench.harness.backends import get_backend
from elasticbench.harness.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    choose_kernels,
    console,
    fail,
    kernel_options,
    run_or_fail,
    split_names,
)
from elasticbench.harness.environment import describe
from elasticbench.harness.execute import Isolation
from elasticbench.harness.hunt.job import HuntJob
from elasticbench.harness.hunt.space import MAX_ELEMENTS
from elasticbench.harness.numerics.dtypes import DTYPE_NAMES, check_dtypes
from elasticbench.harness.numerics.truth.row_truth import DEFAULT_PRECISION, MIN_PRECISION
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.session import Session, SessionError


def replay_command(spec: KernelSpec, case: Path) -> str:
    """The verify command that judges the saved case again, as the hunt did."""
    env = [f"{k}={shlex.quote(v)}" for k, v in get_backend(spec.backend).environment().items()]
    args = ["elasticbench", "verify", "--case", str(case), "--only", spec.name]
    if spec.source != "builtin":
        args += ["--kernel-file", spec.source]
    if spec.mode != "fwd":
        args += ["--mode", spec.mode]
    return " ".join([*env, *(shlex.quote(a) for a in args)])


@click.command()
@kernel_options("hunt")
@click.option("--mode", default="fwd", show_default=True, metavar="fwd|bwd",
              help="Hunt forward kernels or backward (gradient) kernels.")
@click.option("--budget", type=float, default=60.0, show_default=True, metavar="SECONDS",
              help="Seconds of search, shared by the chosen kernels (shrinking a failure "
                   "may take a little more).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the search (the same seed retraces the same configurations).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Results file of every configuration tried [results/hunts/<time>.json]; "
                   "reproducers are saved beside it.")
@click.option("--precision", type=int, default=DEFAULT_PRECISION, show_default=True,
              help="Bits of the mpmath reference.")
@click.option("--isolate", is_flag=True,
              help="Call kernels in a worker process: a crash or OOM kill is a failure found.")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help="A call that runs longer than this is a failure found (implies --isolate).")
@click.option("--max-trials", type=int, default=None, hidden=True)
@click.option("--max-elements", type=int, default=MAX_ELEMENTS, hidden=True)
def hunt(functions, backends, dtypes, only, kernel_files, mode, budget, seed, json_path,
         precision, isolate, timeout, max_trials, max_elements) -> None:
    """Search for an input that breaks a kernel: shapes, layouts, parameters, generator mixes
    and extreme values, steered toward a larger share of the error budget. A failure is shrunk
    to a minimal reproducer saved as a case file (replay it with `verify --case FILE`).

    Exit code 1 when a kernel failed, 0 when the budget ran out with none failing, 2 for bad
    usage, 130 when interrupted (the configurations tried so far are kept).
    """
    functions, backends, dtypes = split_names(functions), split_names(backends), split_names(dtypes)
    only = split_names(only)
    try:
        check_dtypes(dtypes)
    except ValueError as e:
        fail(str(e))
    if mode not in ("fwd", "bwd"):
        fail(f"unknown --mode {mode!r} (choose from fwd, bwd)")
    if not budget > 0:
        fail(f"--budget must be a positive number of seconds, got {budget:g}")
    if precision < MIN_PRECISION:
        fail(f"--precision must be at least {MIN_PRECISION} bits, got {precision}")
    if timeout is not None and not timeout > 0:
        fail(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if (max_trials is not None and max_trials < 1) or max_elements < 1:
        fail("--max-trials and --max-elements must be at least 1")
    kernels = choose_kernels(functions, backends, only, kernel_files, mode)
    chosen = dtypes or list(DTYPE_NAMES)
    if not any(k.supports(d) for k in kernels for d in chosen):
        fail(f"no chosen kernel takes {', '.join(chosen)}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(json_path) if json_path else Path("results") / "hunts" / f"{stamp}.json"
    meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "matrix": "hunt",
            "precision": precision,
            "hunt": {"budget_s": budget, "seed": seed, "dtypes": chosen, "mode": mode},
            **describe(include_gpu=False)}
    job = HuntJob(kernels, chosen, budget, seed, path.with_suffix(""), precision=precision,
                  isolation=Isolation(isolate, timeout), max_trials=max_trials,
                  max_elements=max_elements, replay=replay_command)
    try:
        session = Session(job.kind, path, meta, console=console(stderr=True))
    except SessionError as e:
        fail(str(e))
    complete = run_or_fail(session, job, path)
    _report(job, path, complete)


def _report(job: HuntJob, path: Path, complete: bool) -> None:
    failed = [h for h in job.results if h.found is not None]
    untried = [h for h in job.results if h.found is None and not h.trials]
    for h in job.results:
        name = f"{h.spec.name}{'' if h.spec.mode == 'fwd' else ' (bwd)'}"
        if h in untried:  # no verdict: nothing was judged
            click.echo(f"UNTRIED {name}: no configuration judged in its {h.seconds:.0f}s "
                       f"share of the budget (a larger --budget, or --only {h.spec.name})")
            continue
        if h.found is None:
            click.echo(f"pass {name}: {h.trials} configurations in {h.seconds:.0f}s "
                       f"({rate(h.trials, h.seconds, h.kernel_s)}), none failed (at most "
                       f"{h.best_fraction:.0%} of the error budget)")
            continue
        first = h.found.trial.record
        click.echo(f"FAIL {name}: {first.reason}")
        rows, n = first.shape
        click.echo(f"  found after {h.trials - (h.shrunk.steps if h.shrunk else 0)} "
                   f"configurations ({h.found_s:.1f} s): {h.found.config.label()} {rows}x{n} "
                   f"{h.found.config.layout} {h.found.config.dtype} "
                   + " ".join(f"{k}={v:g}" for k, v in h.found.config.params))
        if h.shrunk is not None:
            s = h.shrunk.trial.record
            click.echo(f"  shrunk in {h.shrunk.steps} trials to {s.shape[0]}x{s.shape[1]} "
                       f"{h.shrunk.input.layout} ({h.shrunk.input.elements} of {rows * n} "
                       f"elements) "
                       + " ".join(f"{k}={v:g}" for k, v in h.shrunk.input.params)
                       + f": {s.reason}")
        if h.case_path is not None:
            click.echo(f"  case file {h.case_path}")
            click.echo(f"  reproduce: {replay_command(h.spec, h.case_path)}")
    click.echo(job.stats.summary())
    trials = sum(h.trials for h in job.results)
    seconds = sum(h.seconds for h in job.results)
    line = (f"{len(failed)} of {len(job.results)} kernels failed"
            + (f", {len(untried)} untried" if untried else "")
            + f"; {trials} configurations "
            f"({rate(trials, seconds, sum(h.kernel_s for h in job.results), 'kernels')}) in {path}")
    if not complete:
        click.echo(f"interrupted: {line}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo(line)
    sys.exit(EXIT_FAILED if failed else EXIT_OK)


def rate(trials: int, seconds: float, kernel_s: float, who: str = "kernel") -> str:
    """Configurations judged per second, and the share of the time the kernels' own calls
    took (what no faster reference can give back), for the summary."""
    if seconds <= 0:
        return "-"
    return (f"{trials / seconds:.1f} configurations/s, {min(1.0, kernel_s / seconds):.0%} "
            f"of it in the {who}")
