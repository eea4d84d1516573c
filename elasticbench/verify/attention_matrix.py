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
    generator = "normal"                            # elasticbench.inputs.attention
    shapes = [[1, 2, 16, 16, 8]]                    # batch, heads, length_q, length_k, dim
    params.elastic_attention = { causal = [1] }     # optional, per input
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..functions import ATTENTION_FUNCTIONS, get_attention_function
from ..inputs.attention import Shape, get_attention_generator
from ..numerics.dtypes import DTYPE_NAMES, check_dtypes
from .case import Case
from .matrix import CaseFileError, read_toml

TABLE = "attention_verify"


@dataclass(frozen=True)
class AttentionInputs:
    generator: str
    shapes: tuple[Shape, ...]
    params: dict[str, dict[str, list[float]]] = field(default_factory=dict)


@dataclass(frozen=True)
class AttentionMatrix:
    name: str
    seed: int
    dtypes: tuple[str, ...]
    params: dict[str, dict[str, list[float]]]
    inputs: tuple[AttentionInputs, ...]


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


def _grids(value: Any, where: str) -> dict[str, dict[str, list[float]]]:
    if not isinstance(value, dict):
        raise CaseFileError(f"{where}: params must be a table of attention functions")
    out = {}
    for fname, grid in value.items():
        try:
            fn = get_attention_function(fname)
            if not isinstance(grid, dict):
                raise ValueError(f"params.{fname} must map names to lists")
            lists = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
            fn.param_grid(lists)
        except ValueError as e:
            raise CaseFileError(f"{where}: {e}") from None
        out[fname] = lists
    return out


def load_attention_matrix(path: Path) -> AttentionMatrix:
    """Read and validate the [attention_verify] table of a case file."""
    table = read_toml(path).get(TABLE)
    where = str(path)
    if not isinstance(table, dict):
        raise CaseFileError(f"{where}: no [{TABLE}] table (attention kernels are verified on "
                            f"an attention matrix, like cases/verify-attention.toml)")
    try:
        dtypes = check_dtypes(table.get("dtypes", DTYPE_NAMES))
    except ValueError as e:
        raise CaseFileError(f"{where}: {e}") from None
    inputs = []
    for i, item in enumerate(table.get("inputs", [])):
        w = f"{where}: inputs[{i}]"
        if not isinstance(item, dict) or "generator" not in item:
            raise CaseFileError(f"{w}: needs a generator name")
        try:
            get_attention_generator(item["generator"])
            shapes = tuple(parse_attention_size(s) for s in item.get("shapes", []))
        except ValueError as e:
            raise CaseFileError(f"{w}: {e}") from None
        if not shapes:
            raise CaseFileError(f"{w}: needs at least one shape")
        inputs.append(AttentionInputs(item["generator"], shapes,
                                      _grids(item.get("params", {}), w)))
    if not inputs:
        raise CaseFileError(f"{where}: [{TABLE}] lists no inputs")
    seed = table.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise CaseFileError(f"{where}: seed must be a whole number")
    return AttentionMatrix(Path(path).stem, seed, dtypes, _grids(table.get("params", {}), where),
                           tuple(inputs))


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
