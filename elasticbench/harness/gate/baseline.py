"""Committed baselines: a results file copied, checked, under results/baselines/<name>.json.

Saved from several runs of one plan, a baseline also keeps a noise floor per kernel and case:
the spread of the per-process medians within a run, and the shift between runs that every
process of a run shares (runs on other days see spread that the processes of one run
cannot). Its records are the first run's.

pytest-benchmark files (JSON with raw rounds, --benchmark-save-data) make baselines the same
way: each file is one run of one process, the first file is kept, and the noise floor of
each benchmark is the spread of the files' medians.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from elasticbench.harness.gate.load import METRICS, benchmark_name, check_file, load
from elasticbench.harness.gate.stats import noise_floor_of_runs
from elasticbench.harness.records import (
    BenchmarkNoiseFloorEntry,
    NoiseFloorEntry,
    ResultsFile,
    RunRecord,
    load_results,
    read_json,
    write_json_atomic,
)

DEFAULT_DIR = Path("results") / "baselines"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def baseline_name(doc: dict[str, Any], name: str | None) -> str:
    """The given name, else the case's name (run) or 'verify'; checked to be a plain name."""
    name = name or doc.get("case_name") or doc.get("kind") or "baseline"
    if not _NAME.match(name) or name.endswith(".json"):
        raise ValueError(f"a baseline name is letters, digits, '.', '_' or '-' "
                         f"(no .json); got {name!r}")
    return name


def _clean_results(path: Path, results: ResultsFile) -> ResultsFile:
    """results (the file at path) if it is complete and no kernel of it raised."""
    if results.doc.get("complete") is False:
        raise ValueError(f"{path} is an interrupted run; finish it before making it a "
                         "baseline")
    if not results.records:
        raise ValueError(f"{path} has no records")
    errors = [r.kernel for r in results.records
              if isinstance(r, RunRecord) and r.error is not None]
    if errors:
        raise ValueError(f"{path}: {len(errors)} record(s) raised (first: {errors[0]}); "
                         "a baseline must be clean")
    return results


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
    first = {("run", *r.key): r for r in load_results(runs[0]).records}
    out = []
    for key, per_run in pooled["time"].items():
        floor = noise_floor_of_runs(per_run)
        if floor is None or key not in first:
            continue
        sd, run_sd = {"time": floor.sd_log}, {"time": floor.run_sd_log}
        bw = noise_floor_of_runs(pooled["bandwidth-fraction"].get(key) or [])
        if bw is not None:
            sd["bandwidth-fraction"], run_sd["bandwidth-fraction"] = bw.sd_log, bw.run_sd_log
        out.append(NoiseFloorEntry(**first[key].identity, sd_log=sd, df=floor.df,
                                   run_sd_log=run_sd, run_df=floor.run_df).to_dict())
    return out


def _pytest_benchmark_doc(path: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """raw if every benchmark of it kept its raw rounds; ValueError otherwise."""
    if not raw["benchmarks"]:
        raise ValueError(f"{path} has no benchmarks")
    bare = [benchmark_name(b) for b in raw["benchmarks"]
            if not (isinstance(b, dict) and isinstance((b.get("stats") or {}).get("data"), list)
                    and b["stats"]["data"])]
    if bare:
        raise ValueError(f"{path}: {len(bare)} benchmark(s) without raw rounds (first: "
                         f"{bare[0]}); run pytest with --benchmark-save-data for a baseline")
    return raw


def benchmark_floors(files: list[Path]) -> list[dict[str, Any]]:
    """Per benchmark of pytest-benchmark files (each one run of one process): the spread of
    the files' log medians (docs/gates.md); left out with fewer than two files."""
    per_run: dict[tuple, list] = {}
    for path in files:
        for key, s in load(path).series.items():
            if s.groups:
                per_run.setdefault(key, []).append(s.groups)
    out = []
    for key, runs in per_run.items():
        floor = noise_floor_of_runs(runs)
        if floor is not None:
            out.append(BenchmarkNoiseFloorEntry(
                benchmark=key[1], sd_log={"time": floor.sd_log}, df=floor.df,
                run_sd_log={"time": floor.run_sd_log}, run_df=floor.run_df).to_dict())
    return out


def _check_same_plan(results: list[Path], keys: list[set]) -> None:
    """ValueError unless every file measured the first file's series."""
    for path, theirs in zip(results[1:], keys[1:], strict=True):
        if theirs != keys[0]:
            odd = sorted(map(str, keys[0] ^ theirs))[0]
            raise ValueError(f"{path} is not a run of the plan of {results[0]} "
                             f"(first difference: {odd})")


def _kinds(paths: list[Path]) -> tuple[str, list[Any]]:
    """The one kind of all the files, and each one's checked ResultsFile (the JSON of a
    pytest-benchmark file); ValueError when they mix kinds."""
    raws = [read_json(p) for p in paths]
    files = [check_file(raw, p) or raw for raw, p in zip(raws, paths, strict=True)]
    kinds = [f.kind if isinstance(f, ResultsFile) else "pytest-benchmark" for f in files]
    for path, kind in zip(paths[1:], kinds[1:], strict=True):
        if kind != kinds[0]:
            raise ValueError(f"{path} is a {kind} file, {paths[0]} a {kinds[0]} file: a "
                             "baseline is made of runs of one plan")
    return kinds[0], files


def save_baseline(results: list[Path], name: str | None = None, directory: Path = DEFAULT_DIR,
                  force: bool = False) -> tuple[Path, dict[str, Any]]:
    """Copy the first of one or more complete runs of one plan (elasticbench run files, verify
    files or pytest-benchmark files with raw rounds) to directory/<name>.json, with a note of
    its origin and the noise floor all of them measure."""
    results = [Path(p) for p in results]
    kind, files = _kinds(results)
    if kind == "pytest-benchmark":
        docs = [_pytest_benchmark_doc(p, raw) for p, raw in zip(results, files, strict=True)]
        _check_same_plan(results, [{benchmark_name(b) for b in d["benchmarks"]} for d in docs])
        default = "pytest-benchmark"
    else:
        clean = [_clean_results(p, f) for p, f in zip(results, files, strict=True)]
        _check_same_plan(results, [{r.key for r in f.records} for f in clean])
        docs = [f.doc for f in clean]  # the first is copied as it was written
        default = None
    doc = docs[0]
    out = Path(directory) / f"{baseline_name(doc, name or default)}.json"
    if out.exists() and not force:
        raise ValueError(f"{out} exists; pass --force to replace it")
    doc["saved_baseline"] = {"name": out.stem, "from": [str(p) for p in results],
                             "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if kind == "run":
        doc["noise_floor"] = noise_floors(results)
    elif kind == "pytest-benchmark":
        doc["noise_floor"] = benchmark_floors(results)
    write_json_atomic(out, doc)
    return out, doc
