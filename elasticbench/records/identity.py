"""What a record is a result for, the same for every kind of record and for merge and gates."""

from __future__ import annotations

from typing import Any

IDENTITY_FIELDS = ("kernel", "mode", "dtype", "input", "shape", "params", "seed", "layout")


def record_key(record: dict[str, Any]) -> tuple:
    """Equal keys mean the same kernel on the same case."""
    return (
        record.get("kernel"),
        record.get("mode", "fwd"),
        record.get("dtype"),
        record.get("input"),
        tuple(record.get("shape", ())),
        tuple(sorted((record.get("params") or {}).items())),
        record.get("seed"),
        record.get("layout", "packed"),  # inputs/layouts.py; run records are packed
    )
