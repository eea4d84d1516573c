"""Merging the shard files of one plan (see elasticbench/shards.py) back into one results file.

Each shard file records the fingerprint of the whole plan; a merge refuses shards of
different plans or settings, the same shard twice, overlapping records and missing shards.
Records are merged as written: a run shard holds whole cells, so each record already carries
its speedup and copy bandwidth. Only records of older shard files that lack them get them
here, from their own shard's ceilings and their cell's baseline among the merged records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..bench.runner import fill_speedups
from ..records import ResultsFileError, read_results, record_key


class MergeError(ValueError):
    """Shard files that cannot be merged; the message says which and why."""


_SAME = ("kind", "case", "mode", "seed", "dtypes", "sizes", "baseline", "policy")


def merge_docs(docs: list[tuple[str, dict[str, Any]]], allow_partial: bool = False
               ) -> dict[str, Any]:
    """One results document from shard documents; MergeError on overlap or mismatch."""
    if not docs:
        raise MergeError("no shard files given")
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
    owner: dict[tuple, str] = {}
    records: list[dict[str, Any]] = []
    for path, d in docs:
        copy_gbps = (d.get("ceilings") or {}).get("copy_gbps")
        for r in d["records"]:
            if copy_gbps is not None:
                r.setdefault("copy_gbps", copy_gbps)  # older files: their shard's ceilings
            key = record_key(r)
            if key in owner:
                raise MergeError(f"{path} and {owner[key]} both hold {key[0]} "
                                 f"{key[2]} {list(key[4])}: overlapping shards")
            owner[key] = path
            records.append(r)
    records.sort(key=lambda r: r.get("plan_position", 0))
    head = {k: v for k, v in docs[0][1].items() if k not in ("records", "shard")}
    head["merged_from"] = [{"path": p, "index": s["index"], "machine": d.get("machine"),
                            "ceilings": d.get("ceilings"), "commit": d.get("commit")}
                           for (p, d), (_, s) in zip(docs, shards, strict=True)]
    head["complete"] = all(d.get("complete") for _, d in docs) and not missing
    head["shards"] = {"count": first["count"], "matrix": first["matrix"],
                      "merged": sorted(seen), "missing": missing}
    verification: dict[str, Any] = {}
    for _, d in docs:
        verification.update(d.get("verification") or {})
    if verification:
        head["verification"] = verification
    if head.get("kind") == "run":
        fill_speedups(records)
    head["records"] = records
    return head


def merge_files(paths: list[str | Path], allow_partial: bool = False) -> dict[str, Any]:
    """Read shard files (run or verify) and merge them; errors are one line."""
    docs = []
    for p in paths:
        try:
            docs.append((str(p), read_results(Path(p))))
        except ResultsFileError as e:
            raise MergeError(str(e)) from None
    return merge_docs(docs, allow_partial)
