"""The attention matrix: the [attention_verify] table of a case file
(cases/verify-attention.toml) and the cases it expands to.

    [attention_verify]
    seed = 20261123
    dtypes = ["fp64", "fp32", "fp16", "bf16"]
    [attention_verify.params.elastic_attention]     # a grid per attention function
    tau = [0.01, 1, 10]
    beta = [0, 1]
    causal = [0, 1]
    [[attention_verify.inputs]]
    generator = "normal"                            # kinds/attention/qkv_inputs.py
    shapes = [[1, 2, 16, 16, 8]]                    # batch, heads, length_q, length_k, dim
    params.elastic_attention = { causal = [1] }     # optional, per input
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elasticbench.harness.functions import ATTENTION_FUNCTIONS, get_attention_function
from elasticbench.harness.kinds.attention.qkv_inputs import Shape, get_attention_generator
from elasticbench.harness.numerics.dtypes import DTYPE_NAMES, check_dtypes
from elasticbench.harness.records.fields import RecordError, entry, positive
from elasticbench.harness.verify.case import Case
from elasticbench.harness.verify.tables import (
    CaseFileError,
    Grid,
    checked,
    param_grids,
    read_table,
    read_toml,
)

TABLE = "attention_verify"


@dataclass(frozen=True)
class AttentionInputs:
    """One [[attention_verify.inputs]]: a generator, its shapes, its own grids (optional)."""

    generator: str
    shapes: tuple[tuple[int, int, int, int, int], ...] = entry((), check=positive)
    params: dict[str, Grid] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checked("generator", get_attention_generator, self.generator)
        if not self.shapes:
            raise RecordError("shapes", "needs at least one shape")
        object.__setattr__(self, "params", param_grids(self.params, get_attention_function))


@dataclass(frozen=True)
class AttentionMatrix:
    """A validated [attention_verify] table."""

    name: str
    seed: int = 0
    dtypes: tuple[str, ...] = DTYPE_NAMES
    params: dict[str, Grid] = field(default_factory=dict)
    inputs: tuple[AttentionInputs, ...] = ()

    def __post_init__(self) -> None:
        checked("dtypes", check_dtypes, self.dtypes)
        if not self.inputs:
            raise RecordError("inputs", "lists none")
        object.__setattr__(self, "params", param_grids(self.params, get_attention_function))


@dataclass(frozen=True)
class AttentionCase(Case):
    """An attention case: q, k, v of the five sizes (batch, heads, length_q, length_k, dim)."""

    shape: Shape

    @property
    def scale(self) -> float:
        """SDPA's default, 1/sqrt(head_dim)."""
        return 1.0 / math.sqrt(self.shape[4])


def parse_attention_size(text: Any) -> Shape:
    """'BxHxLQxLKxD' (or a list of five) -> the five sizes, each >= 1."""
    parts = text if isinstance(text, list) else str(text).lower().replace("×", "x").split("x")
    try:
        values = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 5 or min(values) < 1 or any(isinstance(p, bool) for p in parts):
        raise ValueError(f"an attention size is BxHxLQxLKxD (batch, heads, query length, key "
                         f"length, head dim), each >= 1, like 1x2x16x16x8; got {text!r}")
    return values  # type: ignore[return-value]


def load_attention_matrix(path: Path) -> AttentionMatrix:
    """Read and validate the [attention_verify] table of a case file."""
    table = read_toml(path).get(TABLE)
    if not isinstance(table, dict):
        raise CaseFileError(f"{path}: no [{TABLE}] table (attention kernels are verified on "
                            f"an attention matrix, like cases/verify-attention.toml)")
    return read_table(AttentionMatrix, table, str(path), TABLE, name=Path(path).stem)


def expand_attention(matrix: AttentionMatrix, functions: list[str],
                     dtypes: list[str] | None = None, generators: list[str] | None = None,
                     sizes: list[Shape] | None = None,
                     params: dict[str, float] | None = None) -> list[AttentionCase]:
    """Every case of the matrix for these functions, as verify.matrix.expand does for rows."""
    cases = []
    for fname in functions:
        fn = ATTENTION_FUNCTIONS[fname]
        fixed = {k: [v] for k, v in (params or {}).items() if k in fn.param_names}
        for spec in matrix.inputs:
            if generators and spec.generator not in generators:
                continue
            grid = fn.param_grid({**(spec.params.get(fname, matrix.params.get(fname)) or {}),
                                  **fixed})
            for shape in sizes or spec.shapes:
                for dtype in matrix.dtypes:
                    if dtypes and dtype not in dtypes:
                        continue
                    cases += [AttentionCase(fname, spec.generator, shape, dtype,
                                            tuple(c.items()), matrix.seed) for c in grid]
    return cases
