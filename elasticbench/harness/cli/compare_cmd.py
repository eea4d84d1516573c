"""`elasticbench compare BASE CURRENT`: per-case ratios with confidence intervals and p-values."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from elasticbench.harness.cli.common import EXIT_OK, console, fail
from elasticbench.harness.gate.compare import Comparison, compare, parse_fraction
from elasticbench.harness.gate.load import METRICS, load_side
from elasticbench.harness.gate.render import render_markdown, render_text
from elasticbench.harness.gate.stats import METHODS
from elasticbench.harness.records import ResultsFileError, write_json_atomic


def comparison_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options compare and gate share."""
    for deco in reversed([
        click.argument("files", nargs=-1, type=click.Path(dir_okay=False)),
        click.option("--base", "more_base", multiple=True, type=click.Path(dir_okay=False),
                     metavar="FILE", help="A (further) base file, repeatable: the processes "
                                          "of every base file are pooled."),
        click.option("--current", "more_current", multiple=True,
                     type=click.Path(dir_okay=False), metavar="FILE",
                     help="A (further) current file, repeatable."),
        click.option("--metric", type=click.Choice(METRICS), default="time", show_default=True,
                     help="time: seconds per call; bandwidth-fraction: the share of the run's "
                          "own copy bandwidth reached (for baselines from another machine)."),
        click.option("--alpha", type=float, default=0.01, show_default=True,
                     help="Significance level of the test over processes; the printed "
                          "interval is the 95% one (1 - alpha above 0.05)."),
        click.option("--max-slowdown", "max_slowdown", default="10%", show_default=True,
                     metavar="PCT", help="Slowdown the gate tolerates, e.g. 10%."),
        click.option("--ci", "method", type=click.Choice(METHODS), default="t",
                     show_default=True,
                     help="Interval of the ratio over processes: a pooled t interval on "
                          "process medians, or a hierarchical bootstrap (processes, then "
                          "samples)."),
        click.option("--markdown", "markdown", type=click.Path(dir_okay=False), metavar="PATH",
                     help="Also write a Markdown summary for a pull request."),
        click.option("--json", "json_path", type=click.Path(dir_okay=False), metavar="PATH",
                     help="Also write the comparison as JSON."),
    ]):
        fn = deco(fn)
    return fn


def sides(files: tuple[str, ...], more_base: tuple[str, ...], more_current: tuple[str, ...]
          ) -> tuple[list[str], list[str]]:
    """The files of each side: positional BASE CURRENT (if given) first, then --base and
    --current; a side left empty exits 2."""
    if len(files) not in (0, 2):
        fail(f"give BASE and CURRENT (two files), or --base/--current; got {len(files)} "
             "positional file(s)")
    base = list(files[:1]) + list(more_base)
    current = list(files[1:]) + list(more_current)
    if not base or not current:
        fail("both sides need a file: BASE CURRENT, or --base FILE and --current FILE")
    return base, current


def build(base: list[str], current: list[str], metric: str, alpha: float, max_slowdown: str,
          method: str, advisory: bool = False) -> Comparison:
    """Load both sides and compare them; unusable input exits 2 with one line."""
    if not 0 < alpha < 1:
        fail(f"--alpha must be between 0 and 1, got {alpha:g}")
    try:
        threshold = parse_fraction(max_slowdown)
        return compare(load_side(base, metric), load_side(current, metric), alpha=alpha,
                       max_slowdown=threshold, method=method, timing_advisory=advisory)
    except ResultsFileError as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))


def to_json(cmp: Comparison) -> dict[str, Any]:
    """The comparison as plain data."""
    def est(r):
        return None if r.est is None else {"ratio": r.est.ratio, "lo": r.est.lo,
                                           "hi": r.est.hi, "p": r.est.p,
                                           "n_base": r.est.n_base,
                                           "n_current": r.est.n_current,
                                           "processes": list(r.est.processes),
                                           "noise_sd_log": None if r.est.noise is None
                                           else r.est.noise.sd_log,
                                           "noise_run_sd_log": None if r.est.noise is None
                                           else r.est.noise.run_sd_log,
                                           "confidence": r.est.confidence,
                                           "method": r.est.method}
    return {
        "schema": "elasticbench.compare/1", "base": cmp.base_path, "current": cmp.current_path,
        "metric": cmp.metric, "alpha": cmp.alpha, "confidence": cmp.confidence,
        "max_slowdown": cmp.max_slowdown,
        "paired": cmp.paired, "failed": cmp.failed, "warnings": cmp.warnings,
        "rows": [{"kernel": r.kernel, "case": r.case, "base": r.base, "current": r.current,
                  "estimate": est(r), "verdict": r.verdict, "direction": r.direction,
                  "regression": r.regression,
                  "reason": r.reason} for r in cmp.rows],
        "rollups": [{"kernel": k.kernel, "geomean_ratio": k.ratio, "cases": k.cases,
                     "counts": k.counts} for k in cmp.rollups],
        "numerics": [{"kernel": n.kernel, "case": n.case, "regression": n.regression,
                      "note": n.note,
                      "base_passed": None if n.base is None else n.base.passed,
                      "current_passed": None if n.current is None else n.current.passed}
                     for n in cmp.numerics],
    }


def write_outputs(cmp: Comparison, markdown: str | None, json_path: str | None) -> None:
    try:
        if markdown:
            Path(markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(markdown).write_text(render_markdown(cmp))
        if json_path:
            write_json_atomic(Path(json_path), to_json(cmp))
    except OSError as e:
        fail(f"cannot write {markdown if markdown else json_path}: {e.strerror or e}")


@click.command("compare")
@comparison_options
def compare_(files, more_base, more_current, metric, alpha, max_slowdown, method, markdown,
             json_path) -> None:
    """Compare results files (run, verify or pytest-benchmark JSON) case by case.

    For each kernel and case: the medians, the ratio current/base with its interval over the
    processes that measured it (95%, or 1 - alpha for alpha above 0.05), its p-value and a
    verdict that never contradicts that interval (slower, faster, not significant, same,
    inconclusive, not comparable); then the geometric mean of the ratios per kernel. Always
    exits 0 on usable input; `elasticbench gate` turns the same comparison into an exit code.
    """
    cmp = build(*sides(files, more_base, more_current), metric, alpha, max_slowdown, method)
    render_text(cmp, console())
    write_outputs(cmp, markdown, json_path)
    raise SystemExit(EXIT_OK)
