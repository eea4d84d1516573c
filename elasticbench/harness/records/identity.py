"""What a record is a result for: the kernel and the case every kind of record shares, and
the key that merge and gates match records by."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from elasticbench.harness.functions import ATTENTION_FUNCTIONS
from elasticbench.harness.records.fields import JSONRecord, RecordError, entry, positive

Mode = Literal["fwd", "bwd"]
IDENTITY_FIELDS = ("kernel", "mode", "dtype", "input", "shape", "params", "seed", "layout")


def record_key(record: Mapping[str, Any]) -> tuple:
    """Equal keys mean the same kernel on the same case: the key of a JSON object (or of a
    record's `identity`), whichever IDENTITY_FIELDS it has."""
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


class Identified:
    """A record that says what it is a result for: its IDENTITY_FIELDS, and their key."""

    @property
    def identity(self) -> dict[str, Any]:
        """The IDENTITY_FIELDS the record's type declares and that are set (as written)."""
        return {f: v for f in IDENTITY_FIELDS if (v := getattr(self, f, None)) is not None}

    @property
    def key(self) -> tuple:
        """What this record is a result for (see record_key)."""
        return record_key(self.identity)


@dataclass(kw_only=True)
class KernelCase(JSONRecord, Identified):
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

    @property
    def generated_by(self) -> str | None:
        """The generator of the kernel's input (a verify record's `input`, a run record's
        `generator`)."""
        return None

    def check_measured(self) -> None:
        """RecordError unless the record holds the measurement tables of it are drawn from
        (RunRecord: every timed field, unless the kernel raised); nothing else measures."""
