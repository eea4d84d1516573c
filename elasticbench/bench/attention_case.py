"""The [attention_run] table of a case file (docs/attention.md section 6): what `run` times
for attention kernels, validated into an AttentionRunCase (bench/attention.py times it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..functions import ATTENTION, get_attention_function
from ..numerics.dtypes import check_dtypes
from ..registry import get_kernel
from ..verify.matrix import CaseFileError, read_toml
from .timing import Policy

TABLE = "attention_run"
GIB = 1 << 30


@dataclass(frozen=True)
class AttentionRunCase:
    """A validated [attention_run] table."""

    name: str
    description: str = ""
    kernels: tuple[str, ...] = ()
    baseline: str | None = "sdpa"
    dtypes: tuple[str, ...] = ("fp32",)
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    lengths: tuple[int, ...] = (512,)
    causal: tuple[int, ...] = (0, 1)
    padded: tuple[float, ...] = (0.0,)  # shares of each batch's keys padded (0: no mask)
    modes: tuple[str, ...] = ("fwd", "bwd")
    quadratic: tuple[str, ...] = ()
    quadratic_limit_gib: float = 4.0
    max_length: dict[str, int] = field(default_factory=dict)  # kernel -> longest timed
    seed: int = 0
    verify: str = "verify-attention-quick"
    params: dict[str, float] = field(default_factory=dict)
    timing: Policy = field(default_factory=Policy)


def load_attention_run(path: Path) -> AttentionRunCase:
    """Read and validate the [attention_run] table; CaseFileError names the key at fault."""
    table = read_toml(Path(path)).get(TABLE)
    where = str(path)
    if not isinstance(table, dict):
        raise CaseFileError(f"{where}: no [{TABLE}] table")
    known = {f.name for f in fields(AttentionRunCase)} - {"name"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise CaseFileError(f"{where}: [{TABLE}] has no key {unknown[0]!r} "
                            f"(keys: {', '.join(sorted(known))})")
    kw: dict[str, Any] = {"name": Path(path).stem}
    try:
        for key in ("kernels", "dtypes", "modes", "quadratic"):
            if key in table:
                kw[key] = tuple(str(v) for v in table[key])
        for key in ("lengths", "causal"):
            if key in table:
                kw[key] = tuple(int(v) for v in table[key])
        for key in ("batch", "heads", "head_dim", "seed"):
            if key in table:
                kw[key] = int(table[key])
        for key in ("description", "verify"):
            if key in table:
                kw[key] = str(table[key])
        if "baseline" in table:
            kw["baseline"] = str(table["baseline"]) or None
        if "max_length" in table:
            kw["max_length"] = {str(k): int(v) for k, v in dict(table["max_length"]).items()}
        if "padded" in table:
            kw["padded"] = tuple(float(v) for v in table["padded"])
        if "quadratic_limit_gib" in table:
            kw["quadratic_limit_gib"] = float(table["quadratic_limit_gib"])
        fn = get_attention_function("elastic_attention")
        kw["params"] = {k: v for k, v in fn.validate_params(table.get("params", {})).items()
                        if k in fn.row_params}
        kw["timing"] = Policy(**table.get("timing", {}))
        case = AttentionRunCase(**kw)
        check_dtypes(case.dtypes)
        for m in case.modes:
            if m not in ("fwd", "bwd"):
                raise ValueError(f"modes are fwd and bwd, got {m!r}")
        if min((*case.lengths, case.batch, case.heads, case.head_dim)) < 1:
            raise ValueError("batch, heads, head_dim and lengths must be >= 1")
        if not set(case.causal) <= {0, 1}:
            raise ValueError("causal takes 0 and 1")
        if not all(0 <= p < 1 for p in case.padded):
            raise ValueError("padded takes shares in [0, 1)")
        for name in (*case.kernels, *([case.baseline] if case.baseline else [])):
            for mode in case.modes:
                if get_kernel(name, mode).kind != ATTENTION:
                    raise ValueError(f"{name} is not an attention kernel")
    except (TypeError, ValueError) as e:
        raise CaseFileError(f"{where}: {TABLE}: {e}".splitlines()[0]) from None
    return case


