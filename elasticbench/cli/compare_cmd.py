"""`elasticbench compare BASE CURRENT`: per-case ratios with confidence intervals and p-values."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..gate.compare import Comparison, compare, parse_fraction
from ..gate.load import METRICS, load
from ..gate.render import render_markdown, render_text
from ..records import ResultsFileError, write_json_atomic
from .common import EXIT_OK, console, fail


def comparison_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options compare and gate share."""
    for deco in reversed([
        click.argument("base", type=click.Path(dir_okay=False)),
        click.argument("current", type=click.Path(dir_okay=False)),
        click.option("--metric", type=click.Choice(METRICS), default="time", show_default=True,
                     help="time: seconds per call; bandwidth-fraction: the share of the run's "
                          "own copy bandwidth reached (for baselines from another machine)."),
        click.option("--alpha", type=float, default=0.01, show_default=True,
                     help="Significance level of the test on raw samples."),
        click.option("--max-slowdown", "max_slowdown", default="10%", show_default=True,
                     metavar="PCT", help="Slowdown the gate tolerates, e.g. 10%."),
        click.option("--ci", "method", type=click.Choice(["hl", "bootstrap"]), default="hl",
                     show_default=True,
                     help="Interval of the ratio: Hodges-Lehmann or a seeded bootstrap."),
        click.option("--markdown", "markdown", type=click.Path(dir_okay=False), metavar="PATH",
                     help="Also write a Markdown summary for a pull request."),
        click.option("--json", "json_path", type=click.Path(dir_okay=False), metavar="PATH",
                     help="Also write the comparison as JSON."),
    ]):
        fn = deco(fn)
    return fn


def build(base: str, current: str, metric: str, alpha: float, max_slowdown: str, method: str,
          advisory: bool = False) -> Comparison:
    """Load both files and compare them; unusable input exits 2 with one line."""
    if not 0 < alpha < 1:
        fail(f"--alpha must be between 0 and 1, got {alpha:g}")
    try:
        threshold = parse_fraction(max_slowdown)
        return compare(load(base, metric), load(current, metric), alpha=alpha,
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
                                           "method": r.est.method}
    return {
        "schema": "elasticbench.compare/1", "base": cmp.base_path, "current": cmp.current_path,
        "metric": cmp.metric, "alpha": cmp.alpha, "max_slowdown": cmp.max_slowdown,
        "paired": cmp.paired, "failed": cmp.failed, "warnings": cmp.warnings,
        "rows": [{"kernel": r.kernel, "case": r.case, "base": r.base, "current": r.current,
                  "estimate": est(r), "verdict": r.verdict, "regression": r.regression,
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
def compare_(base, current, metric, alpha, max_slowdown, method, markdown, json_path) -> None:
    """Compare two results files (run, verify or pytest-benchmark JSON) case by case.

    For each kernel and case: the medians, the ratio current/base with a 95% interval, the
    p-value of a Mann-Whitney U test on the raw samples and a verdict (slower, faster, same,
    not comparable); then the geometric mean of the ratios per kernel. Always exits 0 on
    usable input; `elasticbench gate` turns the same comparison into an exit code.
    """
    cmp = build(base, current, metric, alpha, max_slowdown, method)
    render_text(cmp, console())
    write_outputs(cmp, markdown, json_path)
    raise SystemExit(EXIT_OK)
