"""Merging the shard files of one plan (see elasticbench/harness/shards.py) back into one results file.

Each shard file records the fingerprint of the whole plan; a merge refuses shards of
different plans or settings, the same shard twice, overlapping records and missing shards.
Records are merged as written: a run shard holds whole cells, so each record already carries
its speedup and copy bandwidth. Only records of older shard files that lack them get them
here, from their own shard's ceilings and their cell's baseline among the merged records.
Merge decides from the typed records and writes each record's JSON object as it was read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from elasticbench.harness.bench.runner import BaselineTimes
from elasticbench.harness.records import (
    Record,
    ResultsFile,
    ResultsFileError,
    RunRecord,
    check_results,
    load_results,
)


class MergeError(ValueError):
    """Shard files that cannot be merged; the message says which and why."""


_SAME = ("kind", "case", "mode", "seed", "dtypes", "sizes", "baseline", "policy")


def merge_docs(docs: list[tuple[str, dict[str, Any]]], allow_partial: bool = False
               ) -> dict[str, Any]:
    """One results document from shard documents (each checked: ResultsFileError names a
    bad record); MergeError on overlap or mismatch."""
    return merge_results([check_results(d, path) for path, d in docs], allow_partial)


def merge_results(files: list[ResultsFile], allow_partial: bool = False) -> dict[str, Any]:
    """One results document from checked shard files; MergeError on overlap or mismatch."""
    if not files:
        raise MergeError("no shard files given")
    docs = [(f.source, f.doc) for f in files]
    shards, missing = _check_shards(docs, allow_partial)
    merged = _merged_records(files)
    first = shards[0][1]
    head = {k: v for k, v in docs[0][1].items() if k not in ("records", "shard")}
    head["merged_from"] = [{"path": p, "index": s["index"], "machine": d.get("machine"),
                            "ceilings": d.get("ceilings"), "commit": d.get("commit")}
                           for (p, d), (_, s) in zip(docs, shards, strict=True)]
    head["complete"] = all(d.get("complete") for _, d in docs) and not missing
    head["shards"] = {"count": first["count"], "matrix": first["matrix"],
                      "merged": sorted(s["index"] for _, s in shards), "missing": missing}
    verification: dict[str, Any] = {}
    for _, d in docs:
        verification.update(d.get("verification") or {})
    if verification:
        head["verification"] = verification
    if head.get("kind") == "run":
        _fill_speedups(merged)
    head["records"] = [raw for raw, _ in merged]
    return head


def _check_shards(docs: list[tuple[str, dict[str, Any]]], allow_partial: bool
                  ) -> tuple[list[tuple[str, dict[str, Any]]], list[int]]:
    """(path, shard header) of each document, and the shards missing; MergeError unless they
    are distinct shards of one matrix run with the same settings (and complete, unless
    allow_partial)."""
    shards = []
    for path, d in docs:
        s = d.get("shard")
        if not isinstance(s, dict):
            raise MergeError(f"{path} is not a shard file (run it with --shard K/N)")
        shards.append((path, s))
    first_path, first = shards[0]
    for path, s in shards[1:]:
        for f in ("count", "matrix"):
            if s.get(f) != first.get(f):
                raise MergeError(f"{path} and {first_path} are shards of different matrices "
                                 f"({f}: {s.get(f)} vs {first.get(f)})")
    for path, d in docs[1:]:
        for f in _SAME:
            if d.get(f) != docs[0][1].get(f):
                raise MergeError(f"{path} and {first_path} differ in {f!r}; "
                                 "they were not run with the same settings")
    seen: dict[int, str] = {}
    for path, s in shards:
        if s["index"] in seen:
            raise MergeError(f"{path} and {seen[s['index']]} are both shard "
                             f"{s['index']}/{s['count']}")
        seen[s["index"]] = path
    missing = sorted(set(range(1, first["count"] + 1)) - set(seen))
    if missing and not allow_partial:
        names = ", ".join(f"{i}/{first['count']}" for i in missing)
        raise MergeError(f"shard(s) {names} missing (pass --allow-partial to merge anyway)")
    return shards, missing


def _merged_records(files: list[ResultsFile]) -> list[tuple[dict[str, Any], Record]]:
    """Every record of the shards, (as written, typed), in plan order; MergeError when two
    shards hold the same one."""
    owner: dict[tuple, str] = {}
    merged: list[tuple[dict[str, Any], Record]] = []
    for f in files:
        copy_gbps = (f.doc.get("ceilings") or {}).get("copy_gbps")
        for raw, r in zip(f.doc["records"], f.records, strict=True):
            if copy_gbps is not None:
                raw.setdefault("copy_gbps", copy_gbps)  # older files: their shard's ceilings
            key = r.key
            if key in owner:
                raise MergeError(f"{f.source} and {owner[key]} both hold {r.kernel} "
                                 f"{r.dtype} {list(r.shape)}: overlapping shards")
            owner[key] = f.source
            merged.append((raw, r))
    merged.sort(key=lambda m: (m[1].plan_position or 0) if isinstance(m[1], RunRecord) else 0)
    return merged


def _fill_speedups(merged: list[tuple[dict[str, Any], Record]]) -> None:
    """Give run records (as written) that lack a speedup the one their cell's baseline among
    them implies: for merging shard files written before each shard kept whole cells."""
    baselines = BaselineTimes(r for _, r in merged)
    for raw, r in merged:
        if "speedup" not in raw and (s := baselines.speedup(r)) is not None:
            raw["speedup"] = s


def merge_files(paths: list[str | Path], allow_partial: bool = False) -> dict[str, Any]:
    """Read shard files (run or verify) and merge them; errors are one line."""
    files = []
    for p in paths:
        try:
            files.append(load_results(p))
        except ResultsFileError as e:
            raise MergeError(str(e)) from None
    return merge_results(files, allow_partial)
