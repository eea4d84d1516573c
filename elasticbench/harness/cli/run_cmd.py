"""`elasticbench run`: time kernels over a case matrix against the machine's measured roofs."""

from __future__ import annotations

import time
from pathlib import Path

import click

from elasticbench.harness.cli.common import (
    case_path,
    check_survival,
    choose_kernels,
    fail,
    kernel_options,
    run_session,
    split_names,
    survival_options,
)
from elasticbench.harness.execute import Isolation
from elasticbench.harness.kinds import RunOptions, kind_of_case
from elasticbench.harness.numerics.dtypes import check_dtypes


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
    try:
        check_dtypes(dtypes)
    except ValueError as e:
        fail(str(e))
    shard_kn = check_survival(timeout, resume_path, json_path, shard)
    path = case_path(case_file, quick, "quick", "default")
    options = RunOptions(functions, backends, dtypes, split_names(sizes), mode,
                         split_names(only), list(kernel_files), processes,
                         Isolation(isolate, timeout), choose_kernels)
    try:
        job, meta = kind_of_case(path).run_job(path, options)
    except ValueError as e:
        fail(str(e))
    out_path = Path(resume_path or json_path) if (resume_path or json_path) else (
        Path("results") / "runs" / f"{time.strftime('%Y%m%dT%H%M%S')}.json")
    run_session(job, out_path, meta, shard=shard_kn, resume=bool(resume_path))
