"""Committed baselines: a results file copied, checked, under results/baselines/<name>.json.

Saved from several runs of one plan, a baseline also keeps a noise floor per kernel and case:
the spread of the per-process medians within a run, and the shift between runs that every
process of a run shares (runs on other days see spread that the processes of one run
cannot). Its records are the first run's.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from ..records import (
    IDENTITY_FIELDS,
    NoiseFloorEntry,
    read_results,
    record_key,
    write_json_atomic,
)
from .load import METRICS, load
from .stats import noise_floor_of_runs

DEFAULT_DIR = Path("results") / "baselines"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def baseline_name(doc: dict[str, Any], name: str | None) -> str:
    """The given name, else the case's name (run) or 'verify'; checked to be a plain name."""
    name = name or doc.get("case_name") or doc.get("kind") or "baseline"
    if not _NAME.match(name) or name.endswith(".json"):
        raise ValueError(f"a baseline name is letters, digits, '.', '_' or '-' "
                         f"(no .json); got {name!r}")
    return name


def _clean_results(results: Path) -> dict[str, Any]:
    doc = read_results(results)
    if doc.get("complete") is False:
        raise ValueError(f"{results} is an interrupted run; finish it before making it a "
                         "baseline")
    if not doc["records"]:
        raise ValueError(f"{results} has no records")
    errors = [r.get("kernel") for r in doc["records"] if "error" in r]
    if errors:
        raise ValueError(f"{results}: {len(errors)} record(s) raised (first: {errors[0]}); "
                         "a baseline must be clean")
    return doc


def noise_floors(runs: list[Path]) -> list[dict[str, Any]]:
    """Per timed series of the runs: its identity and, per metric, the spread of the log
    medians of its processes within a run and the shift between runs (docs/gates.md), with
    their degrees of freedom; series measured by a single process in all are left out."""
    pooled: dict[str, dict[tuple, list]] = {m: {} for m in METRICS}
    for path in runs:
        for metric in METRICS:
            for key, s in load(path, metric).series.items():
                if s.groups:
                    pooled[metric].setdefault(key, []).append(s.groups)
    first = {("run", *record_key(r)): r for r in read_results(runs[0])["records"]}
    out = []
    for key, per_run in pooled["time"].items():
        floor = noise_floor_of_runs(per_run)
        if floor is None or key not in first:
            continue
        sd, run_sd = {"time": floor.sd_log}, {"time": floor.run_sd_log}
        bw = noise_floor_of_runs(pooled["bandwidth-fraction"].get(key) or [])
        if bw is not None:
            sd["bandwidth-fraction"], run_sd["bandwidth-fraction"] = bw.sd_log, bw.run_sd_log
        identity = {f: first[key][f] for f in IDENTITY_FIELDS if f in first[key]}
        out.append(NoiseFloorEntry(**identity, sd_log=sd, df=floor.df, run_sd_log=run_sd,
                                   run_df=floor.run_df).to_dict())
    return out


def save_baseline(results: list[Path], name: str | None = None, directory: Path = DEFAULT_DIR,
                  force: bool = False) -> tuple[Path, dict[str, Any]]:
    """Copy the first of one or more complete runs of one plan to directory/<name>.json, with
    a note of its origin and the noise floor all of them measure."""
    docs = [_clean_results(Path(p)) for p in results]
    doc = docs[0]
    for path, other in zip(results[1:], docs[1:], strict=True):
        if other.get("kind") != doc.get("kind"):
            raise ValueError(f"{path} is a {other.get('kind')} file, {results[0]} a "
                             f"{doc.get('kind')} file: a baseline is made of runs of one plan")
        mine = {record_key(r) for r in doc["records"]}
        theirs = {record_key(r) for r in other["records"]}
        if mine != theirs:
            odd = sorted(map(str, mine ^ theirs))[0]
            raise ValueError(f"{path} is not a run of the plan of {results[0]} "
                             f"(first difference: {odd})")
    out = Path(directory) / f"{baseline_name(doc, name)}.json"
    if out.exists() and not force:
        raise ValueError(f"{out} exists; pass --force to replace it")
    doc["saved_baseline"] = {"name": out.stem, "from": [str(p) for p in results],
                             "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if doc.get("kind") == "run":
        doc["noise_floor"] = noise_floors([Path(p) for p in results])
    write_json_atomic(out, doc)
    return out, doc
