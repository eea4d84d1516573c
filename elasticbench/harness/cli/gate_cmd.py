"""`elasticbench gate BASE CURRENT`: exit 1 on a significant slowdown or a numerics regression."""

from __future__ import annotations

import click

from elasticbench.harness.cli.common import EXIT_FAILED, EXIT_OK, console
from elasticbench.harness.cli.compare_cmd import build, comparison_options, sides, write_outputs
from elasticbench.harness.gate.render import render_text


@click.command("gate")
@comparison_options
@click.option("--timing", "timing", type=click.Choice(["gate", "advisory"]), default="gate",
              show_default=True,
              help="advisory: report timing regressions but fail only on numerics.")
def gate(files, more_base, more_current, metric, alpha, max_slowdown, method, markdown,
         json_path, timing) -> None:
    """Fail (exit 1) when CURRENT regressed against BASE; exit 0 otherwise.

    A timing regression is a case slower with p < alpha whose whole printed interval of the
    ratio (95%, or 1 - alpha for alpha above 0.05) lies above 1 + max-slowdown; the interval spans the spread between processes, and a case
    whose spread is unknown (one process per side, no noise floor) is inconclusive, never a
    failure. A numerics regression is a verification that passed and now fails, or a worst
    error that grew past its budget. Unusable input exits 2.
    """
    cmp = build(*sides(files, more_base, more_current), metric, alpha, max_slowdown, method,
                advisory=timing == "advisory")
    render_text(cmp, console(), gate=True)
    write_outputs(cmp, markdown, json_path)
    raise SystemExit(EXIT_FAILED if cmp.failed else EXIT_OK)
