"""The [attention_run] table of a case file (docs/attention.md section 6): what `run` times
for attention kernels, validated into an AttentionRunCase (bench/attention.py times it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..functions import ATTENTION, get_attention_function
from ..numerics.dtypes import check_dtypes
from ..records.fields import entry, nonnegative, positive
from ..registry import get_kernel
from ..verify.tables import read_table, read_toml
from .timing import Policy

TABLE = "attention_run"
GIB = 1 << 30


@dataclass(frozen=True)
class AttentionRunCase:
    """A validated [attention_run] table (its fields are checked as records' are)."""

    name: str
    description: str = ""
    kernels: tuple[str, ...] = ()
    baseline: str | None = "sdpa"  # "" in the file: none
    dtypes: tuple[str, ...] = ("fp32",)
    batch: int = entry(1, check=positive)
    heads: int = entry(8, check=positive)
    head_dim: int = entry(64, check=positive)
    lengths: tuple[int, ...] = entry((512,), check=positive)
    causal: tuple[Literal[0, 1], ...] = (0, 1)
    modes: tuple[Literal["fwd", "bwd"], ...] = ("fwd", "bwd")
    quadratic: tuple[str, ...] = ()
    quadratic_limit_gib: float = entry(4.0, check=positive)
    max_length: dict[str, int] = entry(factory=dict, check=positive)  # kernel -> longest timed
    seed: int = entry(0, check=nonnegative)
    verify: str = "verify-attention-quick"
    params: dict[str, float] = field(default_factory=dict)  # the kernels' row parameters
    timing: Policy = field(default_factory=Policy)

    def __post_init__(self) -> None:
        check_dtypes(self.dtypes)
        for name in (*self.kernels, *([self.baseline] if self.baseline else [])):
            for mode in self.modes:
                if get_kernel(name, mode).kind != ATTENTION:
                    raise ValueError(f"{name} is not an attention kernel")
        functions = {get_kernel(n, m).function for n in (*self.kernels, self.baseline or "")
                     if n for m in self.modes}
        object.__setattr__(self, "params", row_params(self.params, sorted(functions)))


def row_params(values: dict[str, float], functions: list[str]) -> dict[str, float]:
    """The row parameters (tau, beta) of these attention functions at the given values, each
    checked by every function that takes it, defaults filled in."""
    out: dict[str, float] = {}
    for fn in map(get_attention_function, functions):
        taken = {k: v for k, v in values.items() if k in fn.row_params}
        out.update({k: v for k, v in fn.validate_params(taken).items() if k in fn.row_params})
    unknown = sorted(set(values) - set(out))
    if unknown:
        raise ValueError(f"params: no kernel's function has a parameter {unknown[0]!r}")
    return out


def load_attention_run(path: Path) -> AttentionRunCase:
    """Read and validate the [attention_run] table; CaseFileError names the key at fault."""
    table = read_toml(Path(path)).get(TABLE)
    if isinstance(table, dict) and table.get("baseline") == "":
        table = {**table, "baseline": None}
    return read_table(AttentionRunCase, table, str(path), TABLE, name=Path(path).stem)
