"""What a record is a result for: the kernel and the case every kind of record shares, and
the key that merge and gates match records by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..functions import ATTENTION_FUNCTIONS
from .fields import JSONRecord, RecordError, entry, positive

Mode = Literal["fwd", "bwd"]


@dataclass(kw_only=True)
class KernelCase(JSONRecord):
    """The kernel (its name, function, backend and source file) on a dtype, shape and
    parameters: the fields every record starts with."""

    kernel: str
    function: str
    backend: str | None = None
    source: str = "builtin"  # or the kernel file
    mode: Mode = "fwd"
    dtype: str
    # (rows, n) for a row function; (batch, heads, length_q, length_k, head_dim) for an
    # attention function (docs/attention.md)
    shape: tuple[int, ...] = entry(check=positive)

    def __post_init__(self) -> None:
        want = 5 if self.function in ATTENTION_FUNCTIONS else 2
        if len(self.shape) != want:
            raise RecordError("shape", f"must be a list of {want} for {self.function}, got "
                                       f"{list(self.shape)!r}")
    params: dict[str, float] = entry(factory=dict)

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
