"""Committed baselines: a results file copied, checked, under results/baselines/<name>.json."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from ..records import read_results, write_json_atomic

DEFAULT_DIR = Path("results") / "baselines"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def baseline_name(doc: dict[str, Any], name: str | None) -> str:
    """The given name, else the case's name (run) or 'verify'; checked to be a plain name."""
    name = name or doc.get("case_name") or doc.get("kind") or "baseline"
    if not _NAME.match(name) or name.endswith(".json"):
        raise ValueError(f"a baseline name is letters, digits, '.', '_' or '-' "
                         f"(no .json); got {name!r}")
    return name


def save_baseline(results: Path, name: str | None = None, directory: Path = DEFAULT_DIR,
                  force: bool = False) -> tuple[Path, dict[str, Any]]:
    """Copy a complete results file to directory/<name>.json with a note of its origin."""
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
    out = Path(directory) / f"{baseline_name(doc, name)}.json"
    if out.exists() and not force:
        raise ValueError(f"{out} exists; pass --force to replace it")
    doc["saved_baseline"] = {"name": out.stem, "from": str(results),
                             "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_json_atomic(out, doc)
    return out, doc
