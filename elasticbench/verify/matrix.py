"""The verification matrix: which inputs, shapes, dtypes and parameters each function meets.

A matrix lives in the [verify] table of a TOML case file (see cases/verify.toml). Loading
checks every name and value, so a bad file fails before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import tomllib

from ..functions import get_function
from ..inputs import get_generator
from ..numerics.dtypes import DTYPE_NAMES, get_format


class CaseFileError(ValueError):
    """A case file is missing, unreadable or says something invalid."""


@dataclass(frozen=True)
class InputSpec:
    generator: str
    shapes: tuple[tuple[int, int], ...]
    params: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # per function


@dataclass(frozen=True)
class VerifyMatrix:
    name: str
    seed: int
    dtypes: tuple[str, ...]
    max_elements: int
    params: dict[str, dict[str, list[float]]]
    inputs: tuple[InputSpec, ...]


@dataclass(frozen=True)
class VerifyCase:
    """One input of one function: the unit the reference is computed for."""

    function: str
    generator: str
    shape: tuple[int, int]
    dtype: str
    params: tuple[tuple[str, float], ...]
    seed: int

    @property
    def param_dict(self) -> dict[str, float]:
        return dict(self.params)

    def label(self) -> str:
        p = " ".join(f"{k}={v:g}" for k, v in self.params)
        return f"{self.generator} {self.shape[0]}x{self.shape[1]} {self.dtype} {p}".strip()


def builtin_case(name: str) -> Path:
    """Path of a case file shipped with the package (cases/<name>.toml)."""
    return Path(str(resources.files("elasticbench.cases").joinpath(f"{name}.toml")))


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise CaseFileError(f"case file {path} does not exist") from None
    except OSError as e:
        raise CaseFileError(f"case file {path} cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise CaseFileError(f"case file {path} is not valid TOML: {e}") from None


def _shape(value: Any, where: str) -> tuple[int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise CaseFileError(f"{where}: a shape is [rows, n] with both >= 1, got {value!r}")
    return (value[0], value[1])


def _param_table(value: Any, where: str) -> dict[str, dict[str, list[float]]]:
    if not isinstance(value, dict):
        raise CaseFileError(f"{where}: params must be a table of functions")
    out: dict[str, dict[str, list[float]]] = {}
    for fname, grid in value.items():
        try:
            fn = get_function(fname)
        except ValueError as e:
            raise CaseFileError(f"{where}: {e}") from None
        if not isinstance(grid, dict):
            raise CaseFileError(f"{where}: params.{fname} must map names to lists")
        lists = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
        try:
            fn.param_grid(lists)  # validates names and values
            for k in lists:
                fn.validate_params({k: lists[k][0]})
        except (ValueError, IndexError) as e:
            raise CaseFileError(f"{where}: params.{fname}: {e}") from None
        out[fname] = lists
    return out


def load_matrix(path: Path) -> VerifyMatrix:
    """Read and validate the [verify] table of a case file."""
    data = read_toml(path)
    table = data.get("verify")
    where = str(path)
    if not isinstance(table, dict):
        raise CaseFileError(f"{where}: no [verify] table")
    dtypes = tuple(table.get("dtypes", DTYPE_NAMES))
    for d in dtypes:
        try:
            get_format(d)
        except ValueError as e:
            raise CaseFileError(f"{where}: {e}") from None
    inputs = []
    for i, item in enumerate(table.get("inputs", [])):
        w = f"{where}: inputs[{i}]"
        if not isinstance(item, dict) or "generator" not in item:
            raise CaseFileError(f"{w}: needs a generator name")
        try:
            get_generator(item["generator"])
        except ValueError as e:
            raise CaseFileError(f"{w}: {e}") from None
        shapes = tuple(_shape(s, w) for s in item.get("shapes", []))
        if not shapes:
            raise CaseFileError(f"{w}: needs at least one shape")
        inputs.append(InputSpec(item["generator"], shapes, _param_table(item.get("params", {}), w)))
    if not inputs:
        raise CaseFileError(f"{where}: [verify] lists no inputs")
    seed = table.get("seed", 0)
    max_elements = table.get("max_elements", 1 << 18)
    if not isinstance(seed, int) or not isinstance(max_elements, int) or max_elements < 1:
        raise CaseFileError(f"{where}: seed and max_elements must be whole numbers")
    return VerifyMatrix(
        name=path.stem,
        seed=seed,
        dtypes=dtypes,
        max_elements=max_elements,
        params=_param_table(table.get("params", {}), where),
        inputs=tuple(inputs),
    )


def expand(
    matrix: VerifyMatrix,
    functions: list[str],
    dtypes: list[str] | None = None,
    generators: list[str] | None = None,
    sizes: list[tuple[int, int]] | None = None,
    params: dict[str, float] | None = None,
) -> list[VerifyCase]:
    """Every case of the matrix for these functions, restricted to dtypes and generators;
    `sizes` replace the matrix's shapes and `params` fix a parameter at one value instead of
    its grid (for the functions that have it)."""
    cases = []
    for fname in functions:
        fn = get_function(fname)
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
                    for combo in grid:
                        cases.append(
                            VerifyCase(fname, spec.generator, shape, dtype,
                                       tuple(combo.items()), matrix.seed)
                        )
    return cases
