"""The verification matrix: which inputs, shapes, layouts, dtypes and parameters each
function meets.

A matrix lives in the [verify] table of a TOML case file (see cases/verify.toml; docs/inputs.md
lists the keys). Loading checks every name and value, so a bad file fails before any work
starts. Besides each function's parameter grid, every input can meet parameters drawn
log-uniformly over each parameter's span (`draws`), seeded by the case, so a kernel wrong on
a band of tau between the grid's points is met without a denser grid.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..functions import get_function
from ..functions.base import Function
from ..inputs import get_generator
from ..inputs.explicit import Explicit, parse
from ..inputs.layouts import LAYOUTS, PACKED, check_layout
from ..numerics.dtypes import DTYPE_NAMES, get_format
from .case import Case
from .tables import CaseFileError, read_toml

MAX_ROWS = 256  # rows checked at most per input; more rows are checked on a sample


@dataclass(frozen=True)
class InputSpec:
    generator: str  # a generator's name, or the name of explicit values
    shapes: tuple[tuple[int, int], ...]
    params: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # per function
    layouts: tuple[str, ...] = (PACKED,)
    draws: int | None = None  # parameter sets drawn per case; None: the matrix's
    explicit: Explicit | None = None
    dtypes: tuple[str, ...] | None = None  # only these of the matrix's dtypes


@dataclass(frozen=True)
class VerifyMatrix:
    name: str
    seed: int
    dtypes: tuple[str, ...]
    max_elements: int
    params: dict[str, dict[str, list[float]]]
    inputs: tuple[InputSpec, ...]
    draws: int = 0
    max_rows: int = MAX_ROWS


@dataclass(frozen=True)
class VerifyCase(Case):
    """A row case: the input is (rows, n), laid out as `layout`, generated or explicit."""

    shape: tuple[int, int]
    layout: str = PACKED
    explicit: Explicit | None = None

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "layout": self.layout}

    def label(self) -> str:
        p = " ".join(f"{k}={v:g}" for k, v in self.params)
        where = "" if self.layout == PACKED else f" {self.layout}"
        return f"{self.generator} {self.shape[0]}x{self.shape[1]}{where} {self.dtype} {p}".strip()

    def input(self) -> np.ndarray:
        """The input array in the case's format (generated from the seed, or explicit)."""
        from ..inputs import generate

        if self.explicit is not None:
            return self.explicit.array(self.dtype)
        return generate(self.generator, self.dtype, self.shape, self.seed)


def builtin_case(name: str) -> Path:
    """Path of a case file shipped with the package (cases/<name>.toml)."""
    return Path(str(resources.files("elasticbench.cases").joinpath(f"{name}.toml")))


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


def _columns(item: dict[str, Any], where: str) -> tuple[tuple[int, int], ...]:
    """Shapes from `rows` and `columns = { powers_of_two = [lo, hi], around = [-1, 0, 1] }`:
    n = 2^k + d for k in lo..hi and d in around (n >= 1, each once)."""
    spec, rows = item["columns"], item.get("rows", 1)
    if not isinstance(spec, dict) or set(spec) - {"powers_of_two", "around"}:
        raise CaseFileError(f"{where}: columns is {{ powers_of_two = [lo, hi], around = [...] }}")
    span, around = spec.get("powers_of_two"), spec.get("around", [0])
    ints = (isinstance(span, list) and len(span) == 2 and isinstance(around, list)
            and isinstance(rows, int) and rows >= 1
            and all(isinstance(v, int) and not isinstance(v, bool) for v in [*span, *around]))
    if not ints or not 0 <= span[0] <= span[1] <= 30:
        raise CaseFileError(f"{where}: columns.powers_of_two is [lo, hi] with 0 <= lo <= hi <= 30, "
                            "around a list of whole numbers, rows >= 1")
    ns = sorted({(1 << k) + d for k in range(span[0], span[1] + 1) for d in around} - {0})
    return tuple((rows, n) for n in ns if n >= 1)


def _input(item: Any, where: str) -> InputSpec:
    if not isinstance(item, dict) or not ("generator" in item or "name" in item):
        raise CaseFileError(f"{where}: needs a generator name (or a name and explicit values)")
    explicit = None
    if "generator" in item:
        try:
            get_generator(item["generator"])
        except ValueError as e:
            raise CaseFileError(f"{where}: {e}") from None
        name = item["generator"]
        shapes = tuple(_shape(s, where) for s in item.get("shapes", []))
        if "columns" in item:
            shapes += _columns(item, where)
    else:
        name = item["name"]
        if not isinstance(name, str) or not name:
            raise CaseFileError(f"{where}: name must be a non-empty string")
        try:
            explicit = parse(item, where)
        except ValueError as e:
            raise CaseFileError(str(e)) from None
        shapes = (explicit.shape,)
    if not shapes:
        raise CaseFileError(f"{where}: needs at least one shape")
    layouts = item.get("layouts", [PACKED])
    draws = item.get("draws")
    try:
        if not isinstance(layouts, list) or not layouts:
            raise ValueError(f"layouts is a list of layouts ({', '.join(LAYOUTS)})")
        layouts = tuple(check_layout(v) for v in layouts)
    except ValueError as e:
        raise CaseFileError(f"{where}: {e}") from None
    if draws is not None and not _count(draws):
        raise CaseFileError(f"{where}: draws must be a whole number >= 0, got {draws!r}")
    dtypes = item.get("dtypes")
    if dtypes is not None:
        if not isinstance(dtypes, list) or not dtypes:
            raise CaseFileError(f"{where}: dtypes is a list of formats")
        for d in dtypes:
            try:
                get_format(d)
            except ValueError as e:
                raise CaseFileError(f"{where}: {e}") from None
        dtypes = tuple(dtypes)
    return InputSpec(name, shapes, _param_table(item.get("params", {}), where), layouts, draws,
                     explicit, dtypes)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


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
    inputs = tuple(_input(item, f"{where}: inputs[{i}]")
                   for i, item in enumerate(table.get("inputs", [])))
    if not inputs:
        raise CaseFileError(f"{where}: [verify] lists no inputs")
    seed = table.get("seed", 0)
    max_elements = table.get("max_elements", 1 << 18)
    draws, max_rows = table.get("draws", 0), table.get("max_rows", MAX_ROWS)
    if not isinstance(seed, int) or not isinstance(max_elements, int) or max_elements < 1:
        raise CaseFileError(f"{where}: seed and max_elements must be whole numbers")
    if not _count(draws) or not _count(max_rows) or max_rows < 1:
        raise CaseFileError(f"{where}: draws must be >= 0 and max_rows >= 1 (whole numbers)")
    return VerifyMatrix(
        name=path.stem,
        seed=seed,
        dtypes=dtypes,
        max_elements=max_elements,
        params=_param_table(table.get("params", {}), where),
        inputs=inputs,
        draws=draws,
        max_rows=max_rows,
    )


def draw_params(fn: Function, rng: np.random.Generator) -> dict[str, float]:
    """One parameter set: each parameter log-uniform over its span, to 4 significant digits
    (short enough to read in a label, and a case file replays it exactly)."""
    out = {}
    for p in fn.params:
        lo, hi = p.span
        v = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        out[p.name] = p.validate(float(f"{v:.4g}"))
    return out


def drawn(fn: Function, spec: InputSpec, shape: tuple[int, int], dtype: str, seed: int,
          count: int) -> list[dict[str, float]]:
    """The case's drawn parameter sets: seeded by (seed, function, input, dtype, shape)."""
    if not fn.params or count == 0:
        return []
    rng = np.random.default_rng([seed, zlib.crc32(fn.name.encode()),
                                 zlib.crc32(spec.generator.encode()),
                                 zlib.crc32(dtype.encode()), *shape])
    return [draw_params(fn, rng) for _ in range(count)]


def expand(
    matrix: VerifyMatrix,
    functions: list[str],
    dtypes: list[str] | None = None,
    generators: list[str] | None = None,
    sizes: list[tuple[int, int]] | None = None,
    params: dict[str, float] | None = None,
) -> list[VerifyCase]:
    """Every case of the matrix for these functions, restricted to dtypes and generators:
    each input's shapes x layouts x dtypes x (the parameter grid, then the drawn sets).
    `sizes` replace the matrix's shapes (an explicit input keeps its own) and `params` fix a
    parameter at one value instead of its grid and draws (for the functions that have it)."""
    cases = []
    for fname in functions:
        fn = get_function(fname)
        fixed = {k: [v] for k, v in (params or {}).items() if k in fn.param_names}
        for spec in matrix.inputs:
            if generators and spec.generator not in generators:
                continue
            grid = fn.param_grid({**(spec.params.get(fname, matrix.params.get(fname)) or {}),
                                  **fixed})
            count = 0 if fixed else matrix.draws if spec.draws is None else spec.draws
            shapes = spec.shapes
            if sizes:
                shapes = tuple(s for s in sizes if spec.explicit is None
                               or s == spec.explicit.shape)
            for shape in shapes:
                for dtype in matrix.dtypes:
                    if (dtypes and dtype not in dtypes) or (spec.dtypes
                                                            and dtype not in spec.dtypes):
                        continue
                    sets = grid + [d for d in drawn(fn, spec, shape, dtype, matrix.seed, count)
                                   if d not in grid]
                    for layout in spec.layouts:
                        for combo in sets:
                            cases.append(
                                VerifyCase(fname, spec.generator, shape, dtype,
                                           tuple(combo.items()), matrix.seed, layout,
                                           spec.explicit)
                            )
    return list(dict.fromkeys(cases))  # inputs that meet in one case (--size, --param) once
