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
    generator = "normal"             # input generator (elasticbench.inputs)
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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..functions import get_function
from ..inputs import get_generator
from ..numerics.dtypes import check_dtypes
from ..registry import MODES
from ..verify.matrix import CaseFileError, builtin_case, read_toml
from .timing import Policy

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
    """A validated [run] table."""

    name: str
    description: str = ""
    functions: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    baseline: str | None = "torch_softmax"
    dtypes: tuple[str, ...] = ("fp32",)
    sizes: tuple[tuple[int, int], ...] = ((64, 262144),)
    mode: str = "fwd"
    generator: str = "normal"
    seed: int = 0
    threads: int = 0
    verify: str = "verify-quick"
    verify_inputs: tuple[str, ...] = ()
    params: dict[str, dict[str, float]] = field(default_factory=dict)
    timing: Policy = field(default_factory=Policy)

    def verify_path(self) -> Path:
        p = Path(self.verify)
        return p if p.suffix == ".toml" else builtin_case(self.verify)


_LISTS = ("functions", "backends", "kernels", "exclude", "dtypes", "verify_inputs")
_KNOWN = {f.name for f in fields(RunCase)} - {"name"}


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CaseFileError(f"{where} must be a list of names")
    return tuple(value)


def parse_run_table(table: Any, where: str, name: str) -> RunCase:
    """Validate a [run] table; CaseFileError names the file and the key at fault."""
    if not isinstance(table, dict):
        raise CaseFileError(f"{where}: no [run] table")
    unknown = sorted(set(table) - _KNOWN)
    if unknown:
        raise CaseFileError(f"{where}: [run] has no key {unknown[0]!r} "
                            f"(keys: {', '.join(sorted(_KNOWN))})")
    kw: dict[str, Any] = {"name": name}
    for key in _LISTS:
        if key in table:
            kw[key] = _strings(table[key], f"{where}: run.{key}")
    try:
        for f in kw.get("functions", ()):
            get_function(f)
        check_dtypes(kw.get("dtypes", ()))
        for g in (table.get("generator", "normal"), *kw.get("verify_inputs", ())):
            get_generator(g)
    except ValueError as e:
        raise CaseFileError(f"{where}: {e}") from None
    if "sizes" in table:
        if not isinstance(table["sizes"], list) or not table["sizes"]:
            raise CaseFileError(f"{where}: run.sizes must be a non-empty list")
        try:
            kw["sizes"] = tuple(parse_size(s) for s in table["sizes"])
        except ValueError as e:
            raise CaseFileError(f"{where}: run.sizes: {e}") from None
    mode = table.get("mode", "fwd")
    if mode not in MODES:
        raise CaseFileError(f"{where}: run.mode must be one of {', '.join(MODES)}, got {mode!r}")
    kw["mode"] = mode
    for key in ("seed", "threads"):
        v = table.get(key, 0)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise CaseFileError(f"{where}: run.{key} must be a whole number >= 0, got {v!r}")
        kw[key] = v
    for key in ("description", "generator", "verify"):
        if key in table:
            if not isinstance(table[key], str):
                raise CaseFileError(f"{where}: run.{key} must be a string")
            kw[key] = table[key]
    if "baseline" in table:
        b = table["baseline"]
        if not isinstance(b, str):
            raise CaseFileError(f"{where}: run.baseline must be a kernel name or \"\"")
        kw["baseline"] = b or None
    kw["params"] = _run_params(table.get("params", {}), where)
    kw["timing"] = _timing(table.get("timing", {}), where)
    return RunCase(**kw)


def _run_params(params: Any, where: str) -> dict[str, dict[str, float]]:
    """run.params: each function's parameters, checked by the function."""
    if not isinstance(params, dict):
        raise CaseFileError(f"{where}: run.params must be a table of functions")
    out = {}
    for fname, values in params.items():
        try:
            out[fname] = get_function(fname).validate_params(values)
        except (ValueError, TypeError) as e:
            raise CaseFileError(f"{where}: run.params.{fname}: {e}") from None
    return out


def _timing(timing: Any, where: str) -> Policy:
    """run.timing: the timing policy's fields, checked by Policy."""
    if not isinstance(timing, dict):
        raise CaseFileError(f"{where}: run.timing must be a table")
    allowed = {f.name for f in fields(Policy)}
    bad = sorted(set(timing) - allowed)
    if bad:
        raise CaseFileError(f"{where}: run.timing has no key {bad[0]!r} "
                            f"(keys: {', '.join(sorted(allowed))})")
    try:
        return Policy(**timing)
    except (ValueError, TypeError) as e:
        raise CaseFileError(f"{where}: run.timing: {e}") from None


def load_run_case(path: Path) -> RunCase:
    """Read and validate the [run] table of a case file."""
    return parse_run_table(read_toml(Path(path)).get("run"), str(path), Path(path).stem)
