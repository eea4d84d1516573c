"""Compare two verify results files record by record, ignoring timings.

    python scripts/same_records.py BEFORE.json AFTER.json

Records are matched by their identity (kernel, mode, dtype, input, shape, params, seed,
layout); every other field must be equal but for timings (`seconds`, and the `seconds` of a
record's compile check). Exit 0 when they are, 1 (naming the first differences) when not,
2 for a file that cannot be read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TIMING = {"seconds"}
IDENTITY = ("kernel", "mode", "dtype", "input", "shape", "params", "seed", "layout")


def without_timings(v: Any) -> Any:
    """v with every timing field left out, at any depth."""
    if isinstance(v, dict):
        return {k: without_timings(x) for k, x in v.items() if k not in TIMING}
    if isinstance(v, list):
        return [without_timings(x) for x in v]
    return v


def identity(rec: dict) -> str:
    """The fields that name a record's case, as one comparable string."""
    return json.dumps([rec.get(k) for k in IDENTITY], sort_keys=True)


def differences(before: list[dict], after: list[dict], limit: int = 10) -> list[str]:
    """What differs between two lists of records, in words (at most `limit` lines)."""
    a = {identity(r): without_timings(r) for r in before}
    b = {identity(r): without_timings(r) for r in after}
    out = [f"only in the first: {k}" for k in a.keys() - b.keys()]
    out += [f"only in the second: {k}" for k in b.keys() - a.keys()]
    for k in a.keys() & b.keys():
        fields = sorted(f for f in a[k].keys() | b[k].keys() if a[k].get(f) != b[k].get(f))
        if fields:
            out.append(f"{k}: {', '.join(f'{f}: {a[k].get(f)!r} != {b[k].get(f)!r}' for f in fields)}")
    if len(a) != len(before) or len(b) != len(after):
        out.append("duplicate record identities")
    return out[:limit]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: same_records.py BEFORE.json AFTER.json", file=sys.stderr)
        return 2
    try:
        docs = [json.loads(Path(p).read_text())["records"] for p in argv]
    except (OSError, ValueError, KeyError) as e:
        print(f"same_records: cannot read: {e}", file=sys.stderr)
        return 2
    diff = differences(*docs)
    for line in diff:
        print(line)
    print(f"{len(docs[0])} and {len(docs[1])} records: " + ("differ" if diff else "equal but for timings"))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
