"""The [run] table of a case file: what `elasticbench run` times, and how.

    [run]
    description = "..."
    functions = ["elastic"]          # kernels of these functions (default: all)
    backends = ["numpy", "torch"]    # optional filter
    kernels = ["torch_elastic"]      # optional: exactly these kernels
    exclude = ["numpy_elastic"]      # optional: never these
    baseline = "torch_softmax"       # timed on every shape; speedups are against it
    dtypes = ["fp32"]
    sizes = ["64x262144", "256x4096"]   # ROWSxN strings or [rows, n] pairs
    mode = "fwd"                     # or "bwd"
    generator = "normal"             # input generator (elasticbench.harness.inputs)
    seed = 0
    threads = 0                      # 0: every core
    verify = "verify-quick"          # matrix for the quick verification before timing
    verify_inputs = ["normal", "specials"]   # optional subset of its generators

    [run.params.elastic]             # one value per parameter
    tau = 1.0
    beta = 1.0

    [run.timing]                     # see bench.timing.Policy
    budget_s = 0.5
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from elasticbench.harness.bench.timing import Policy
from elasticbench.harness.functions import get_function
from elasticbench.harness.inputs import get_generator
from elasticbench.harness.numerics.dtypes import check_dtypes
from elasticbench.harness.records.fields import RecordError, entry, nonnegative
from elasticbench.harness.verify.matrix import builtin_case
from elasticbench.harness.verify.tables import CaseFileError, read_table, read_toml

_SIZE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+)\s*$")


def parse_size(text: Any) -> tuple[int, int]:
    """'ROWSxN' (or [rows, n]) -> (rows, n), both >= 1; ValueError says what is wrong."""
    if isinstance(text, list) and len(text) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in text
    ):
        rows, n = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise ValueError(f"a size is ROWSxN, like 64x262144; got {text!r}")
        rows, n = int(m.group(1)), int(m.group(2))
    if rows < 1 or n < 1:
        raise ValueError(f"a size needs rows >= 1 and n >= 1; got {rows}x{n}")
    return rows, n


@dataclass(frozen=True)
class RunCase:
    """A validated [run] table (its fields are checked as records' are)."""

    name: str
    description: str = ""
    functions: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    baseline: str | None = "torch_softmax"  # "" in the file: none
    dtypes: tuple[str, ...] = ("fp32",)
    sizes: tuple[tuple[int, int], ...] = ((64, 262144),)
    mode: Literal["fwd", "bwd"] = "fwd"
    generator: str = "normal"
    seed: int = entry(0, check=nonnegative)
    threads: int = entry(0, check=nonnegative)
    verify: str = "verify-quick"
    verify_inputs: tuple[str, ...] = ()
    params: dict[str, dict[str, float]] = field(default_factory=dict)
    timing: Policy = field(default_factory=Policy)

    def __post_init__(self) -> None:
        checks: tuple[tuple[str, Callable[[Any], object]], ...] = (
            ("functions", lambda v: [get_function(f) for f in v]), ("dtypes", check_dtypes),
            ("generator", get_generator), ("verify_inputs", lambda v: [get_generator(g) for g in v]))
        for key, check in checks:
            try:
                check(getattr(self, key))
            except ValueError as e:
                raise RecordError(key, str(e)) from None
        params = {}
        for fname, values in self.params.items():
            try:
                params[fname] = get_function(fname).validate_params(values)
            except (ValueError, TypeError) as e:
                raise RecordError(f"params.{fname}", str(e)) from None
        object.__setattr__(self, "params", params)

    def verify_path(self) -> Path:
        p = Path(self.verify)
        return p if p.suffix == ".toml" else builtin_case(self.verify)


def parse_run_table(table: Any, where: str, name: str) -> RunCase:
    """Validate a [run] table; CaseFileError names the file and the key at fault."""
    if isinstance(table, dict):
        table = dict(table)
        for key, value in table.items():  # a list of names may be a single name
            if key in _LISTS and isinstance(value, str):
                table[key] = [value]
        if table.get("baseline") == "":
            table["baseline"] = None
        if "sizes" in table:
            table["sizes"] = _sizes(table["sizes"], where)
    return read_table(RunCase, table, where, "run", name=name)


def _sizes(sizes: Any, where: str) -> list[tuple[int, int]]:
    """run.sizes: ROWSxN strings or [rows, n] pairs, at least one."""
    if not isinstance(sizes, list) or not sizes:
        raise CaseFileError(f"{where}: run.sizes must be a non-empty list")
    try:
        return [parse_size(s) for s in sizes]
    except ValueError as e:
        raise CaseFileError(f"{where}: run.sizes: {e}") from None


_LISTS = ("functions", "backends", "kernels", "exclude", "dtypes", "verify_inputs")


def load_run_case(path: Path) -> RunCase:
    """Read and validate the [run] table of a case file."""
    return parse_run_table(read_toml(Path(path)).get("run"), str(path), Path(path).stem)
