"""`elasticbench ab`: two versions of a kernel timed in interleaved rounds, then gated."""

from __future__ import annotations

import click

from elasticbench.harness.bench.cases import load_run_case, parse_size
from elasticbench.harness.cli.common import EXIT_FAILED, EXIT_OK, console, fail, split_names
from elasticbench.harness.cli.compare_cmd import write_outputs
from elasticbench.harness.gate.ab import (
    ABPolicy,
    run_ab,
    versions_from_files,
    versions_from_revision,
)
from elasticbench.harness.gate.compare import compare, parse_fraction
from elasticbench.harness.gate.render import render_text
from elasticbench.harness.numerics.dtypes import check_dtypes
from elasticbench.harness.records import ResultsWriter
from elasticbench.harness.registry import KernelFileError
from elasticbench.harness.verify.matrix import builtin_case
from elasticbench.harness.verify.tables import CaseFileError


@click.command("ab")
@click.option("--kernel-file", "kernel_files", multiple=True, type=click.Path(dir_okay=False),
              metavar="PATH", help="Twice: base then current. With --rev: the file to compare "
                                   "with its own version at REV.")
@click.option("--rev", metavar="REV", help="Compare the working tree against this git revision.")
@click.option("--only", "only", multiple=True, metavar="NAME,...",
              help="With --rev: built-in kernels whose source to compare; else a filter.")
@click.option("--case", "case_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Case file giving dtypes, sizes, parameters [cases/quick.toml].")
@click.option("-d", "--dtype", "dtypes", multiple=True, metavar="D", help="Only these dtypes.")
@click.option("-s", "--size", "sizes", multiple=True, metavar="ROWSxN", help="Shapes to time.")
@click.option("--rounds", type=click.IntRange(5, 10000), default=30, show_default=True,
              help="Interleaved rounds (one sample of each version per round).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the round order.")
@click.option("--threads", type=click.IntRange(0), default=None, metavar="N",
              help="Intra-op threads (0: every core) [the case's]. 1 is steadiest on a "
                   "loaded machine.")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default="wall", show_default=True,
              help="cpu: the calling thread's CPU time, blind to time spent descheduled on a "
                   "loaded machine (needs --threads 1 and kernels on the host).")
@click.option("--alpha", type=float, default=0.01, show_default=True)
@click.option("--max-slowdown", "max_slowdown", default="10%", show_default=True, metavar="PCT")
@click.option("--no-verify", is_flag=True, help="Skip the numerics check of both versions.")
@click.option("--markdown", type=click.Path(dir_okay=False), metavar="PATH")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write the raw A/B samples as a run results file.")
def ab(kernel_files, rev, only, case_file, dtypes, sizes, rounds, seed, threads, clock, alpha,
       max_slowdown, no_verify, markdown, json_path) -> None:
    """Time a base and a current version of kernels in the same process, round by round.

    Noise that comes and goes hits both versions of a round alike; the paired test (Wilcoxon
    signed-rank on the per-round ratios) sees through it. Gate rules and exit codes are those
    of `elasticbench gate`, numerics included: exit 1 on a regression, 0 otherwise, 2 on bad
    input.
    """
    only = split_names(only)
    try:
        threshold = parse_fraction(max_slowdown)
        if not 0 < alpha < 1:
            raise ValueError(f"--alpha must be between 0 and 1, got {alpha:g}")
        shapes = [parse_size(s) for s in split_names(sizes)]
        dts = check_dtypes(split_names(dtypes))
        case = load_run_case(builtin_case("quick") if case_file is None else case_file)
        if rev:
            pairs = versions_from_revision(rev, list(kernel_files), only)
        else:
            if len(kernel_files) != 2:
                raise ValueError("give --kernel-file twice (base, then current), "
                                 "or --rev REV to compare against a git revision")
            pairs = versions_from_files(*kernel_files)
            if only:
                pairs = [p for p in pairs if p.name in only]
                if not pairs:
                    raise ValueError(f"no kernel named {', '.join(only)} in both files")
    except (ValueError, KernelFileError, CaseFileError) as e:
        fail(str(e))
    err = console(stderr=True)
    try:
        result = run_ab(pairs, case, dts or list(case.dtypes), shapes or list(case.sizes),
                        ABPolicy(rounds=rounds, seed=seed, threads=threads, clock=clock),
                        verify=not no_verify,
                        on_cell=lambda s: err.print(f"timing {s}") if err.is_terminal else None)
    except ValueError as e:
        fail(str(e))
    label = f"{rev or kernel_files[0]}"
    result.base.path = f"{label} (base)"
    result.current.path = f"{'working tree' if rev else kernel_files[1]} (current)"
    cmp = compare(result.base, result.current, alpha=alpha, max_slowdown=threshold, paired=True)
    if json_path:
        w = ResultsWriter(json_path, "run", {"ab": {"rev": rev, "kernel_files": kernel_files,
                                                    "rounds": rounds, "seed": seed,
                                                    "threads": result.threads},
                                             "machine": result.base.machine})
        w.records.extend(result.records)
        w.close()
    out = console()
    out.print(f"A/B: {rounds} interleaved rounds, {result.threads} thread(s), "
              f"{'thread CPU time' if clock == 'cpu' else 'wall'} clock")
    render_text(cmp, out, gate=True)
    write_outputs(cmp, markdown, None)
    raise SystemExit(EXIT_FAILED if cmp.failed else EXIT_OK)
