"""The [attention_run] table of a case file (docs/attention.md section 6): what `run` times
for attention kernels, validated into an AttentionRunCase (kinds/attention/run_job.py times it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from elasticbench.harness.bench.timing import Policy
from elasticbench.harness.functions import ATTENTION, get_attention_function
from elasticbench.harness.numerics.dtypes import check_dtypes
from elasticbench.harness.records.fields import RecordError, entry, nonnegative, positive
from elasticbench.harness.registry import get_kernel
from elasticbench.harness.verify.tables import read_table, read_toml

TABLE = "attention_run"
GIB = 1 << 30
PER_LENGTH = "per length"  # sigmoid's bias: -ln(Lk) at each timed length, the library's default


def share(v: float) -> str | None:
    """A share of each batch's keys padded: in [0, 1) (0: no mask; 1 would leave no key)."""
    return None if 0 <= v < 1 else f"must be in [0, 1), got {v!r}"


@dataclass(frozen=True)
class AttentionRunCase:
    """A validated [attention_run] table (its fields are checked as records' are)."""

    name: str
    description: str = ""
    kernels: tuple[str, ...] = ()
    # timed where the registry has them; otherwise left out, and the header's `skipped` says
    # why (kernels a backend may not have yet); a name in `kernels` must be registered
    optional_kernels: tuple[str, ...] = ()
    baseline: str | None = "sdpa"  # "" in the file: none
    dtypes: tuple[str, ...] = ("fp32",)
    batch: int = entry(1, check=positive)
    heads: int = entry(8, check=positive)
    head_dim: int = entry(64, check=positive)
    lengths: tuple[int, ...] = entry((512,), check=positive)
    causal: tuple[Literal[0, 1], ...] = (0, 1)
    padded: tuple[float, ...] = entry((0.0,), check=share)  # each batch's keys padded (0: no mask)
    # 1: cells where the kernels that declare `gate` return out * g (the baseline ungated)
    gate: tuple[Literal[0, 1], ...] = (0,)
    modes: tuple[Literal["fwd", "bwd"], ...] = ("fwd", "bwd")
    quadratic: tuple[str, ...] = ()
    quadratic_limit_gib: float = entry(4.0, check=positive)
    max_length: dict[str, int] = entry(factory=dict, check=positive)  # kernel -> longest timed
    seed: int = entry(0, check=nonnegative)
    verify: str = "verify-attention-quick"
    # shared row parameters (tau = 1.0: every function that takes tau) and per function
    # tables (symax_attention = {eta = 0.5}); validated into function_params
    params: dict[str, Any] = field(default_factory=dict)
    timing: Policy = field(default_factory=Policy)
    # set from the above: each function's row parameters; optional kernels left out, and why
    function_params: dict[str, dict[str, Any]] = field(init=False, default_factory=dict)
    missing: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        check_dtypes(self.dtypes)
        check_gate(self.gate)
        missing: dict[str, str] = {}  # name -> the registry's reason, without its name list
        for name in self.optional_kernels:
            try:
                for mode in self.modes:
                    get_kernel(name, mode)
            except ValueError as e:
                why = str(e).partition("; not loaded: ")[2]
                missing[name] = f" (not loaded: {why})" if why else ""
        object.__setattr__(self, "missing",
                           tuple(f"{k}: not registered here{w}" for k, w in missing.items()))
        object.__setattr__(self, "kernels", (*self.kernels, *(
            k for k in self.optional_kernels if k not in missing)))
        if missing and not self.kernels:  # the baseline alone compares nothing
            raise ValueError(f"none of the case's kernels is registered here: "
                             f"{', '.join(missing)}{''.join(sorted(set(missing.values())))}")
        for name in (*self.kernels, *([self.baseline] if self.baseline else [])):
            for mode in self.modes:
                if get_kernel(name, mode).kind != ATTENTION:
                    raise ValueError(f"{name} is not an attention kernel")
        functions = {get_kernel(n, m).function for n in (*self.kernels, self.baseline or "")
                     if n for m in self.modes}
        object.__setattr__(self, "function_params",
                           function_params(self.params, sorted(functions)))

    def row_params(self, function: str, length: int) -> dict[str, float]:
        """The row parameters a kernel of this function gets at this length (Lq = Lk)."""
        out = dict(self.function_params[function])
        if out.get("bias") == PER_LENGTH:
            out["bias"] = -math.log(length)
        return out


def check_gate(values: tuple[Any, ...]) -> None:
    """RecordError (field gate) unless values is a non-empty list of distinct 0 and 1 (TOML
    integers: true, false and 1.0 are not accepted, so that the cells are named as the
    records' params name them)."""
    if (any(type(v) is not int for v in values) or not values
            or len(set(values)) != len(values)):
        raise RecordError("gate", f"must be [0], [1] or [0, 1] (integers; 0: ungated cells, "
                                  f"1: gated ones), got {list(values)!r}")


def function_params(values: dict[str, Any], functions: list[str]
                    ) -> dict[str, dict[str, Any]]:
    """Each attention function's row parameters: a function's own table, else the shared
    value, else its definition's default (sigmoid's bias: PER_LENGTH), each validated by its
    function. A shared value or a table that no kernel's function takes is an error."""
    shared = {k: v for k, v in values.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in values.items() if isinstance(v, dict)}
    for name in tables:
        if name not in functions:
            raise ValueError(f"params.{name}: no kernel of the case computes {name!r} "
                             f"(its functions: {', '.join(functions)})")
    out: dict[str, dict[str, Any]] = {}
    taken: set[str] = set()
    for fn in map(get_attention_function, functions):
        own = tables.get(fn.name, {})
        if "causal" in own or "causal" in shared:
            raise ValueError("params: causal is the case's `causal` list, not a parameter")
        unknown = sorted(set(own) - set(fn.row_params))
        if unknown:
            raise ValueError(f"params.{fn.name}: {fn.name} has no row parameter "
                             f"{unknown[0]!r} (its row parameters: "
                             f"{', '.join(fn.row_params) or 'none'})")
        given = {k: v for k, v in shared.items() if k in fn.row_params} | own
        taken |= set(shared) & set(fn.row_params)
        if isinstance(given.get("bias"), str) and given["bias"] != PER_LENGTH:
            raise ValueError(f"params.{fn.name}: bias must be a number or {PER_LENGTH!r}, "
                             f"got {given['bias']!r}")
        per_length = "bias" in fn.row_params and given.get("bias", PER_LENGTH) == PER_LENGTH
        if per_length:
            given.pop("bias", None)
        row = {k: v for k, v in fn.validate_params(given).items() if k in fn.row_params}
        out[fn.name] = {**row, "bias": PER_LENGTH} if per_length else row
    unknown = sorted(set(shared) - taken)
    if unknown:
        raise ValueError(f"params: no kernel's function has a parameter {unknown[0]!r}")
    return out


def load_attention_run(path: Path) -> AttentionRunCase:
    """Read and validate the [attention_run] table; CaseFileError names the key at fault."""
    table = read_toml(Path(path)).get(TABLE)
    if isinstance(table, dict) and table.get("baseline") == "":
        table = {**table, "baseline": None}
    return read_table(AttentionRunCase, table, str(path), TABLE, name=Path(path).stem)


