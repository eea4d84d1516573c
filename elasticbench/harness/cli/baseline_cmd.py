"""`elasticbench baseline save RESULTS...`: keep results as a committed baseline."""

from __future__ import annotations

from pathlib import Path

import click

from elasticbench.harness.cli.common import console, fail
from elasticbench.harness.gate.baseline import DEFAULT_DIR, save_baseline
from elasticbench.harness.records import ResultsFileError


@click.group("baseline")
def baseline() -> None:
    """Committed baselines under results/baselines/, read by `elasticbench gate`."""


@baseline.command("save")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--name", metavar="NAME", help="Baseline name [the run's case name].")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=str(DEFAULT_DIR),
              show_default=True, help="Where baselines live.")
@click.option("--force", is_flag=True, help="Replace an existing baseline of that name.")
def save(results, name, directory, force) -> None:
    """Copy a complete, clean results file to <dir>/<name>.json.

    RESULTS are elasticbench run or verify files, or pytest-benchmark JSON saved with
    --benchmark-save-data. Given several runs of one plan (five, ideally on different days,
    each with --processes 3; each pytest-benchmark file is one run of one process), the
    first is kept and all of them give each kernel and case a noise floor: the spread
    between the processes of a run, which a gate against this baseline never assumes to be
    smaller, and the shift between runs, which it adds (docs/gates.md).
    """
    try:
        out, doc = save_baseline([Path(r) for r in results], name, Path(directory), force)
    except ResultsFileError as e:
        fail(str(e))
    except ValueError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write the baseline: {e.strerror or e}")
    floors = doc.get("noise_floor") or []
    count = (f"{len(doc['records'])} records" if "records" in doc
             else f"{len(doc['benchmarks'])} benchmarks")
    console().print(f"saved {count} of {results[0]} as baseline {out}"
                    + (f", with noise floors of {len(floors)} series from {len(results)} "
                       "run(s)" if floors else ""))
