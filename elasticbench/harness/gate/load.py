"""Read what a comparison needs from results files: timing samples and numerics verdicts.

Three inputs are understood: elasticbench run files (`elasticbench.run/1`, raw samples under
each record's `timing`), elasticbench verify files (`elasticbench.verify/1`, numerics only) and
pytest-benchmark JSON (`benchmarks[].stats`, raw `data` when saved with --benchmark-save-data).
Every timing becomes a cost, lower is better, in the unit of the chosen metric:

* `time`: seconds per call;
* `bandwidth-fraction`: seconds per call times the run's own copy bandwidth over the bytes the
  call must move, i.e. 1 / (fraction of copy bandwidth reached). The machine's speed cancels,
  so a baseline from another machine of the same class stays usable.

Each series keeps its samples split by the process that measured them (`timing.processes`
of a run record; a pytest-benchmark file is one process). Several files can make one side of
a comparison (load_side): their processes are pooled per series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elasticbench.harness.gate.stats import NoiseFloor
from elasticbench.harness.records import (
    BenchmarkNoiseFloorEntry,
    NoiseFloorEntry,
    QuickVerdict,
    Record,
    RecordError,
    ResultsFile,
    ResultsFileError,
    VerifyRecord,
    check_results,
    read_json,
)

METRICS = ("time", "bandwidth-fraction")
MACHINE_FIELDS = ("cpu", "arch", "cores", "gpu")


@dataclass
class Series:
    """The timing of one kernel on one case, as costs in the metric's unit."""

    key: tuple
    kernel: str
    case: str
    costs: np.ndarray | None  # raw per-call costs; None when the file kept only statistics
    median: float | None
    error: str | None = None
    groups: list[np.ndarray] | None = None  # costs split by the process that measured them

    def __post_init__(self) -> None:
        if self.costs is not None and self.groups is None:
            self.groups = [self.costs]


@dataclass
class Verdict:
    """The numerics verdict of one kernel on one case (or on one dtype, from a run file)."""

    key: tuple
    kernel: str
    case: str
    passed: bool | None  # None: not verified
    max_ulp: float | None = None
    budget_frac: float | None = None
    reason: str | None = None


@dataclass
class Dataset:
    """One side of a comparison."""

    path: str
    kind: str  # run | verify | pytest-benchmark
    machine: dict[str, Any]
    metric: str
    series: dict[tuple, Series] = field(default_factory=dict)
    numerics: dict[tuple, Verdict] = field(default_factory=dict)
    commit: str | None = None
    notes: list[str] = field(default_factory=list)
    noise: dict[tuple, NoiseFloor] = field(default_factory=dict)  # a baseline's noise floors


def case_label(record: Record) -> str:
    """A short human name of a record's case: dtype, shape, non-default bits."""
    shape = record.shape
    parts = [record.dtype]
    if len(shape) == 2:
        parts.append(f"{shape[0]}x{shape[1]}")
    if record.mode != "fwd":
        parts.append(record.mode)
    gen = record.generated_by
    if gen and gen != "normal":
        parts.append(gen)
    params = record.params
    if params:
        parts.append(",".join(f"{k}={v:g}" if isinstance(v, int | float) else f"{k}={v}"
                              for k, v in sorted(params.items())))
    return " ".join(parts)


def _float(v: Any) -> float | None:
    """A header's number, or None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _finite(v: float | None) -> float | None:
    """A record's number where it is finite; None for none, and for 'inf' and 'nan' (as
    results files store them), which no comparison of worst errors can use."""
    return v if v is not None and math.isfinite(v) else None


def _run_series(results: ResultsFile, metric: str) -> dict[tuple, Series]:
    copy_gbps = _float((results.doc.get("ceilings") or {}).get("copy_gbps"))
    out: dict[tuple, Series] = {}
    for r in results.records:
        key = ("run", *r.key)
        s = Series(key, r.kernel, case_label(r), None, None)
        out[key] = s
        if r.error is not None:
            s.error = r.error
            continue
        if r.timing is None:
            s.error = "no raw samples"
            continue
        scale = 1e-9
        if metric == "bandwidth-fraction":
            gbps = r.copy_gbps or copy_gbps  # merged shards carry their own
            if not gbps or not r.min_bytes:
                s.error = "no copy bandwidth or byte count for bandwidth-fraction"
                continue
            scale = 1e-9 * gbps * 1e9 / r.min_bytes
        s.costs = np.asarray(r.timing.samples_ns, dtype=np.float64) * scale
        s.median = float(np.median(s.costs))
        s.groups = split_processes(s.costs, r.timing.processes)
    return out


def split_processes(costs: np.ndarray, counts: list[int] | None) -> list[np.ndarray]:
    """Samples one process after another, split by the count each process gave (a record
    without counts came from one process; TimingRecord checks that the counts add up)."""
    if counts is None:
        return [costs]
    return np.split(costs, np.cumsum(counts)[:-1])


def _noise_floors(doc: dict[str, Any], metric: str, path: str) -> dict[tuple, NoiseFloor]:
    """A baseline's noise floors in the metric, keyed like its records' series."""
    return {("run", *e.key): floor
            for e, floor in _floor_entries(doc, NoiseFloorEntry, metric,
                                           f"results file {path}")}


def _floor_entries(doc: dict[str, Any], entry: Any, metric: str,
                   where: str) -> list[tuple[Any, NoiseFloor]]:
    """(entry, its floor in the metric) for each noise_floor entry of a baseline that has
    one; a malformed entry is one line naming it (ResultsFileError)."""
    out = []
    for i, raw in enumerate(doc.get("noise_floor") or []):
        try:
            e = entry.from_dict(raw)
        except RecordError as err:
            raise ResultsFileError(f"{where}: noise_floor entry {i}: "
                                   f"{'field ' + err.field + ' ' if err.field else ''}"
                                   f"{err.problem}") from None
        floor = _floor(e, metric)
        if floor is not None:
            out.append((e, floor))
    return out


def _header_verdict(v: Any) -> tuple[Any, Any, Any]:
    """(status, max_ulp, reason) of a verdict in a run file's header, read as leniently as
    the header is (it is not a record: nothing checked it)."""
    return v.get("status"), _float(v.get("max_ulp")), v.get("reason")


def _quick_verdict(v: QuickVerdict) -> tuple[Any, Any, Any]:
    return v.status, _finite(v.max_ulp), v.reason


def _run_numerics(results: ResultsFile) -> dict[tuple, Verdict]:
    """(kernel, dtype) -> the quick verification verdict a run file carries."""
    found = {name: _header_verdict(v)
             for name, v in (results.doc.get("verification") or {}).items()}
    for r in results.records:
        if r.verify is not None:
            found.setdefault(f"{r.kernel}/{r.dtype}", _quick_verdict(r.verify))
    out: dict[tuple, Verdict] = {}
    for name, (status, max_ulp, reason) in found.items():
        kernel, _, dtype = name.rpartition("/")
        passed = True if status == "pass" else False if status == "FAIL" else None
        key = ("numerics", kernel, dtype)
        out[key] = Verdict(key, kernel, dtype, passed, max_ulp, None, reason)
    return out


def _verify_numerics(records: list[VerifyRecord]) -> dict[tuple, Verdict]:
    out: dict[tuple, Verdict] = {}
    for r in records:
        key = ("verify", *r.key)
        out[key] = Verdict(key, r.kernel, case_label(r), r.passed, _finite(r.max_ulp),
                           _finite(r.max_budget_frac), r.reason)
    return out


def _floor(e: NoiseFloorEntry | BenchmarkNoiseFloorEntry, metric: str) -> NoiseFloor | None:
    if metric not in e.sd_log:
        return None
    return NoiseFloor(e.sd_log[metric], e.df, e.run_sd_log.get(metric, 0.0), e.run_df)


def _benchmark_floors(doc: dict[str, Any], path: str) -> dict[tuple, NoiseFloor]:
    """A pytest-benchmark baseline's noise floors, keyed like its series."""
    return {("pytest-benchmark", e.benchmark): floor
            for e, floor in _floor_entries(doc, BenchmarkNoiseFloorEntry, "time", path)}


def benchmark_name(b: dict[str, Any]) -> str:
    """How a pytest-benchmark entry is keyed: its fullname, else its name."""
    return str(b.get("fullname") or b.get("name"))


def _pytest_benchmark(doc: dict[str, Any], metric: str, path: str) -> Dataset:
    if metric != "time":
        raise ResultsFileError(f"{path} is a pytest-benchmark file: only --metric time applies")
    info = doc.get("machine_info") or {}
    machine = {"cpu": (info.get("cpu") or {}).get("brand_raw") or info.get("processor"),
               "arch": info.get("machine"), "cores": (info.get("cpu") or {}).get("count"),
               "gpu": None}
    ds = Dataset(path, "pytest-benchmark", machine, metric,
                 commit=(doc.get("commit_info") or {}).get("id"))
    missing = 0
    for b in doc["benchmarks"]:
        if not isinstance(b, dict) or "stats" not in b:
            raise ResultsFileError(f"{path}: a benchmark entry has no stats")
        extra = b.get("extra_info") or {}
        name = benchmark_name(b)
        kernel = str(extra.get("kernel") or str(b.get("name", name)).split("[")[0])
        case = str(extra.get("case") or b.get("param") or "")
        key = ("pytest-benchmark", name)
        st = b["stats"]
        data = st.get("data")
        costs = np.asarray(data, dtype=np.float64) if isinstance(data, list) and data else None
        missing += costs is None
        ds.series[key] = Series(key, kernel, case, costs,
                                float(np.median(costs)) if costs is not None
                                else _float(st.get("median")))
    if missing:
        ds.notes.append(f"{path}: {missing} benchmark(s) without raw data; save with "
                        "--benchmark-save-data to test them for significance")
    ds.noise = _benchmark_floors(doc, path)
    return ds


EXPECTED = ("an elasticbench run or verify file (schema elasticbench.run/1 or "
            "elasticbench.verify/1) or pytest-benchmark JSON (a benchmarks list, from "
            "--benchmark-json or --benchmark-save)")


def _is_pytest_benchmark(raw: Any) -> bool:
    return isinstance(raw, dict) and isinstance(raw.get("benchmarks"), list) and "schema" not in raw


def check_file(raw: Any, path: Path) -> ResultsFile | None:
    """The checked results file raw is, or None for pytest-benchmark JSON; ResultsFileError,
    naming what was expected, for JSON of any other kind. A run or verify file is checked in
    full."""
    if _is_pytest_benchmark(raw):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("records"), list):
        what = (f"has schema {raw.get('schema')!r}" if isinstance(raw, dict) and "schema" in raw
                else "is neither")
        raise ResultsFileError(f"{path} {what}: expected {EXPECTED}")
    return check_results(raw, path)  # checks the schema and every record; one line otherwise


def load(path: str | Path, metric: str = "time") -> Dataset:
    """Read a run, verify or pytest-benchmark file; ResultsFileError says why it is unusable."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (choose from {', '.join(METRICS)})")
    p = Path(path)
    raw = read_json(p)
    results = check_file(raw, p)
    if results is None:
        return _pytest_benchmark(raw, metric, str(p))
    doc = results.doc
    ds = Dataset(str(p), results.kind,
                 dict(doc.get("machine") or {}), metric, commit=doc.get("commit"))
    if ds.kind == "run":
        ds.series = _run_series(results, metric)
        ds.numerics = _run_numerics(results)
        ds.noise = _noise_floors(doc, metric, str(p))
        if doc.get("complete") is False:
            ds.notes.append(f"{p}: the run was interrupted; only its finished records count")
    else:
        ds.numerics = _verify_numerics(results.records)
    return ds


def _merge_series(a: Series, b: Series) -> Series:
    if a.error or b.error or a.costs is None or b.costs is None:
        why = a.error or b.error or "no raw samples (statistics only)"
        return Series(a.key, a.kernel, a.case, None, a.median, why)
    costs = np.concatenate([a.costs, b.costs])
    return Series(a.key, a.kernel, a.case, costs, float(np.median(costs)),
                  groups=[*(a.groups or []), *(b.groups or [])])


def _merge_verdicts(a: Verdict, b: Verdict) -> Verdict:
    """The worse of two verdicts of one case: a failure anywhere is a failure."""
    worst = min((a, b), key=lambda v: {False: 0, None: 1, True: 2}[v.passed])
    ulps = [v.max_ulp for v in (a, b) if v.max_ulp is not None]
    fracs = [v.budget_frac for v in (a, b) if v.budget_frac is not None]
    return Verdict(a.key, a.kernel, a.case, worst.passed, max(ulps) if ulps else None,
                   max(fracs) if fracs else None, worst.reason)


def load_side(paths: list[str | Path], metric: str = "time") -> Dataset:
    """One side of a comparison from one or more files of one kind: per series, the processes
    of every file pooled; per numerics case, the worst verdict; noise floors kept."""
    if not paths:
        raise ValueError("no results file given for a side")
    sets = [load(p, metric) for p in paths]
    first = sets[0]
    if len(sets) == 1:
        return first
    kinds = {d.kind for d in sets}
    if len(kinds) > 1:
        raise ResultsFileError(f"{', '.join(str(p) for p in paths)}: one side mixes "
                               f"{' and '.join(sorted(kinds))} files")
    out = Dataset(" + ".join(d.path for d in sets), first.kind, dict(first.machine), metric,
                  commit=first.commit)
    for d in sets:
        diffs = machine_differences(first, d)
        if diffs:
            out.notes.append(f"{d.path} was measured on another machine than {first.path} "
                             f"({'; '.join(diffs)})")
        out.notes += d.notes
        for key, s in d.series.items():
            out.series[key] = _merge_series(out.series[key], s) if key in out.series else s
        for key, v in d.numerics.items():
            out.numerics[key] = (_merge_verdicts(out.numerics[key], v) if key in out.numerics
                                 else v)
        for key, f in d.noise.items():
            if key not in out.noise or f.percent > out.noise[key].percent:
                out.noise[key] = f
    return out


def machine_differences(a: Dataset, b: Dataset) -> list[str]:
    """Human lines naming the machine fields that differ between two datasets."""
    out = []
    for f in MACHINE_FIELDS:
        va, vb = a.machine.get(f), b.machine.get(f)
        if va is not None and vb is not None and va != vb:
            out.append(f"{f}: {va} vs {vb}")
    return out
