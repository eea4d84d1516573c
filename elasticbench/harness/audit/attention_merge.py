"""Merge the JSON files of `elasticbench audit --attention` run as several processes into
the one file a single run would have written (docs/attention.md section 7).

The audit of one Triton can run as several processes, each over a part of the weights or
dtypes (`--weights`, `-d`) and writing its own `--json` as it goes; this joins them. The
parts must come from the same Triton, target, kernels (the same kernel source and Triton
cache keys; each part's commit is kept) and head dims, and cover disjoint parts of one
product of dtypes and weights; the result is complete only when every part is.

    python -m elasticbench.harness.audit.attention_merge OUT PART.json PART.json ...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# the kernels are the same when their Triton cache keys are (the kernel functions and every
# function they call); the commit may differ, as the parts start at different times
SAME = ("triton", "arch", "kernel_sha256", "kernel_cache_keys", "head_dims")
DTYPE_ORDER = ("bf16", "fp16", "fp32")
WEIGHT_ORDER = ("elastic", "softmax1", "symax", "stablemax", "sigmoid", "cog")


class MergeError(ValueError):
    """Parts that cannot be one audit; the message says which and why."""


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One audit record from the parts' records (each as the command writes it). Raises
    MergeError when they differ in a field of `SAME`, overlap, or do not cover a product of
    dtypes and weights."""
    if not parts:
        raise MergeError("no parts to merge")
    need = (*SAME, "commit", "dtypes", "weights", "complete", "of", "reports")
    for i, part in enumerate(parts):
        missing = [k for k in need if k not in part]
        if missing:
            raise MergeError(f"part {i + 1} is not an attention audit (no {missing[0]!r})")
    for field in SAME:
        values = {json.dumps(p[field], sort_keys=True) for p in parts}
        if len(values) > 1:
            raise MergeError(f"the parts differ in {field!r}: {' / '.join(sorted(values))}")
    cells: dict[tuple[str, str], int] = {}
    for i, part in enumerate(parts):
        unknown = [n for n in part["dtypes"] if n not in DTYPE_ORDER] + \
            [n for n in part["weights"] if n not in WEIGHT_ORDER]
        if unknown:
            raise MergeError(f"part {i + 1} names an unknown dtype or weight {unknown[0]!r}")
        for dtype in part["dtypes"]:
            for weight in part["weights"]:
                if (dtype, weight) in cells:
                    raise MergeError(f"parts {cells[(dtype, weight)] + 1} and {i + 1} both "
                                     f"audit {weight} {dtype}")
                cells[(dtype, weight)] = i
    dtypes = [d for d in DTYPE_ORDER if any(d == c[0] for c in cells)]
    weights = [w for w in WEIGHT_ORDER if any(w == c[1] for c in cells)]
    absent = [(d, w) for d in dtypes for w in weights if (d, w) not in cells]
    if absent:
        raise MergeError(f"no part audits {absent[0][1]} {absent[0][0]}: the parts must cover "
                         "every weight at every dtype they name")
    reports = [r for p in parts for r in p["reports"]]
    first = parts[0]
    return {**{k: first[k] for k in SAME}, "commit": first["commit"], "dtypes": dtypes,
            "weights": weights,
            "complete": all(p["complete"] for p in parts),
            "configurations": len(reports), "of": sum(p["of"] for p in parts),
            "failing": sum(1 for r in reports if r.get("problems")),
            "parts": [{"commit": p["commit"], "dtypes": p["dtypes"], "weights": p["weights"],
                       "configurations": len(p["reports"]), "of": p["of"],
                       "complete": p["complete"]} for p in parts],
            "reports": reports}


def main(argv: list[str] | None = None) -> int:
    """Merge the files named in argv (OUT PART...) into OUT; 0, or 2 with one line on
    stderr for a bad argument or part."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3:
        print("usage: python -m elasticbench.harness.audit.attention_merge OUT PART.json "
              "PART.json ...", file=sys.stderr)
        return 2
    out, names = Path(args[0]), args[1:]
    records = []
    for name in names:
        try:
            records.append(json.loads(Path(name).read_text()))
        except OSError as e:
            print(f"{name}: cannot be read ({e.strerror or e})", file=sys.stderr)
            return 2
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            print(f"{name}: not JSON ({e})", file=sys.stderr)
            return 2
        if not isinstance(records[-1], dict):
            print(f"{name}: not an attention audit", file=sys.stderr)
            return 2
    try:
        merged = merge(records)
    except MergeError as e:
        print(f"cannot merge {', '.join(names)}: {e}", file=sys.stderr)
        return 2
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(json.dumps(merged, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"{out}: {merged['configurations']} of {merged['of']} configurations "
          f"({'complete' if merged['complete'] else 'partial'}), {merged['failing']} failing")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
