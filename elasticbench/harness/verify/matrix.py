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

from elasticbench.harness.functions import get_function
from elasticbench.harness.functions.definition import Function
from elasticbench.harness.inputs import get_generator
from elasticbench.harness.inputs.explicit import Explicit, parse
from elasticbench.harness.inputs.layouts import LAYOUTS, PACKED, check_layout
from elasticbench.harness.numerics.dtypes import DTYPE_NAMES, check_dtypes
from elasticbench.harness.records.fields import RecordError, entry, nonnegative, positive
from elasticbench.harness.verify.case import Case
from elasticbench.harness.verify.tables import Grid, checked, param_grids, read_table, read_toml

MAX_ROWS = 256  # rows checked at most per input; more rows are checked on a sample


@dataclass(frozen=True)
class Columns:
    """`columns = { powers_of_two = [lo, hi], around = [-1, 0, 1] }`: n = 2^k + d for k in
    lo..hi and d in around (n >= 1, each once)."""

    powers_of_two: tuple[int, int]
    around: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        lo, hi = self.powers_of_two
        if not 0 <= lo <= hi <= 30:
            raise RecordError("powers_of_two", f"is [lo, hi] with 0 <= lo <= hi <= 30, got "
                                               f"{list(self.powers_of_two)}")

    def shapes(self, rows: int) -> tuple[tuple[int, int], ...]:
        lo, hi = self.powers_of_two
        ns = sorted({(1 << k) + d for k in range(lo, hi + 1) for d in self.around} - {0})
        return tuple((rows, n) for n in ns if n >= 1)


@dataclass(frozen=True)
class InputSpec:
    """One [[verify.inputs]]: a generator with `shapes` (and/or `rows` and `columns`), or
    explicit values under a `name` (`values`, or `shape`, `fill` and `set`: inputs/explicit.py).
    Read, `generator` is the generator's name or the explicit values' name, `shapes` every
    shape and `explicit` the values."""

    generator: str | None = None
    name: str | None = None
    shapes: tuple[Any, ...] = ()  # each [rows, n]: checked by _shape
    rows: int = entry(1, check=positive)
    columns: Columns | None = None
    params: dict[str, Grid] = field(default_factory=dict)  # per function
    layouts: tuple[str, ...] = (PACKED,)
    draws: int | None = entry(None, check=nonnegative)  # drawn sets per case; None: matrix's
    dtypes: tuple[str, ...] | None = None  # only these of the matrix's dtypes
    values: Any = None  # the explicit values' keys, checked by inputs/explicit.py
    shape: Any = None
    fill: Any = None
    set: Any = None
    explicit: Explicit | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.generator is not None:
            checked("generator", get_generator, self.generator)
            shapes = tuple(checked("shapes", _shape, s) for s in self.shapes)
            shapes += self.columns.shapes(self.rows) if self.columns else ()
        elif self.name:
            given = {k: getattr(self, k) for k in ("values", "shape", "fill", "set")}
            explicit = checked("", parse, {k: v for k, v in given.items() if v is not None},
                                "explicit values")
            object.__setattr__(self, "explicit", explicit)
            object.__setattr__(self, "generator", self.name)
            shapes = (explicit.shape,)
        else:
            raise RecordError("", "needs a generator name (or a name and explicit values)")
        if not shapes:
            raise RecordError("shapes", "needs at least one shape")
        object.__setattr__(self, "shapes", shapes)
        if not self.layouts:
            raise RecordError("layouts", f"is a list of layouts ({', '.join(LAYOUTS)})")
        checked("layouts", lambda v: [check_layout(x) for x in v], self.layouts)
        if self.dtypes is not None and not self.dtypes:
            raise RecordError("dtypes", "is a list of formats")
        checked("dtypes", check_dtypes, self.dtypes or ())
        object.__setattr__(self, "params", param_grids(self.params, get_function))


def _shape(value: Any) -> tuple[int, int]:
    """[rows, n] -> (rows, n); ValueError unless both are whole numbers >= 1."""
    if not (isinstance(value, list) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)):
        raise ValueError(f"a shape is [rows, n] with both >= 1, got {value!r}")
    return (value[0], value[1])


@dataclass(frozen=True)
class VerifyMatrix:
    """A validated [verify] table."""

    name: str
    seed: int = 0
    dtypes: tuple[str, ...] = DTYPE_NAMES
    max_elements: int = entry(1 << 18, check=positive)
    params: dict[str, Grid] = field(default_factory=dict)
    inputs: tuple[InputSpec, ...] = ()
    draws: int = entry(0, check=nonnegative)
    max_rows: int = entry(MAX_ROWS, check=positive)

    def __post_init__(self) -> None:
        checked("dtypes", check_dtypes, self.dtypes)
        if not self.inputs:
            raise RecordError("inputs", "lists none")
        object.__setattr__(self, "params", param_grids(self.params, get_function))


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
        from elasticbench.harness.inputs import generate

        if self.explicit is not None:
            return self.explicit.array(self.dtype)
        return generate(self.generator, self.dtype, self.shape, self.seed)


def builtin_case(name: str) -> Path:
    """Path of a case file shipped with the package (cases/<name>.toml)."""
    return Path(str(resources.files("elasticbench.cases").joinpath(f"{name}.toml")))


def load_matrix(path: Path) -> VerifyMatrix:
    """Read and validate the [verify] table of a case file."""
    return read_table(VerifyMatrix, read_toml(path).get("verify"), str(path), "verify",
                      name=Path(path).stem)


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
