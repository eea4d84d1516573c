"""`elasticbench merge SHARD... -o OUT`: one results file from the shards of a matrix."""

from __future__ import annotations

from pathlib import Path

import click

from elasticbench.harness.cli.common import console, fail
from elasticbench.harness.gate.merge import MergeError, merge_files
from elasticbench.harness.records import write_json_atomic


@click.command("merge")
@click.argument("shards", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              metavar="PATH", help="The merged results file.")
@click.option("--allow-partial", is_flag=True,
              help="Merge even when some shards are missing (the result is marked incomplete).")
def merge(shards, output, allow_partial) -> None:
    """Combine the files of `run --shard K/N` (or verify shards) into one results file.

    Refuses shards of different matrices or settings, the same shard twice, overlapping
    records and, unless --allow-partial, missing shards. Records are kept as written (a run
    shard holds whole cells, so each has its speedup); older shard files' records that lack
    a speedup get it from their cell's baseline among the merged records.
    """
    try:
        doc = merge_files(list(shards), allow_partial)
    except MergeError as e:
        fail(str(e))
    try:
        write_json_atomic(Path(output), doc)
    except OSError as e:
        fail(f"cannot write {output}: {e.strerror or e}")
    s = doc["shards"]
    console().print(f"merged {len(doc['records'])} records from shards "
                    f"{', '.join(map(str, s['merged']))} of {s['count']} into {output}"
                    + (f" (missing {s['missing']})" if s["missing"] else ""))
