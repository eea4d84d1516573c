"""The process's settings: every ELASTICBENCH_* variable the package reads, in one place.

Each field of `Settings` is one variable: its name, its parser, its default and what it does
are declared with the field (`VARIABLES` is that table, by variable; docs/guide/environment.md
lists the same rows for users). `settings()` reads them all from os.environ at its first call,
parses and validates each, and keeps the result: a library call reads no environment
variable. `refresh()` reads them again, for a test or tool that changes the environment in
its own process; `overriding(...)` replaces fields for a block. A bad value raises ValueError
in one line naming the variable (the CLI prints that line and exits 2), at every call until
it is fixed: a failed read keeps nothing.

The native kernels read ELASTICBENCH_CPP_ISA themselves (kernels/cpp/cpu.cpp), and variables
of other projects (TRITON_INTERPRET, CXX, XDG_CACHE_HOME) stay with the modules that use them.
This module imports nothing heavy (no torch, no Triton, no harness).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

IMPLEMENTATIONS = ("cpp", "triton", "torch")  # what ELASTICBENCH_IMPLEMENTATION may force
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]i?B?)?\s*$", re.IGNORECASE)


def _pow2(value: int) -> bool:
    return value >= 1 and not value & (value - 1)


@dataclass(frozen=True)
class LaunchOptions:
    """The Triton row launcher's arguments (kernels/triton/launch.py).

    max_fused: the longest block (a power of two) held in registers; longer rows stream in
    chunks of `chunk` (a power of two) on the online path. exp2_ulps >= 0: under the
    interpreter, model the GPU's approximate ex2 (flush below 2^-126, every other normal result
    moved that many ulps; docs/triton.md); -1: no model. Ignored on a GPU. splits: programs
    per streamed row (0: the table's choice, `plan_rows`; 1: never split; else that many, at
    most one per chunk). row_block: rows one program holds at once on short rows (0: the
    table's choice; else a power of two). resident: the single-read split path for streamed
    rows (`plan_rows`): 0 where the table takes it (splits 0, and the launch can be
    cooperative), 1 wherever it can run (splits > 1 then sets its programs per row), -1 never.
    """

    max_fused: int = 16384
    chunk: int = 4096
    exp2_ulps: int = -1
    splits: int = 0
    row_block: int = 0
    resident: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            _check(f.name, getattr(self, f.name))


def _check(name: str, value: object) -> None:
    """ValueError unless value is allowed for the LaunchOptions field `name`."""
    if name == "exp2_ulps":
        if not isinstance(value, int) or value < -1:
            raise ValueError(f"exp2_ulps must be an integer >= -1, got {value!r}")
    elif name == "splits":
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"splits must be an integer >= 0 (0: automatic), got {value!r}")
    elif name == "resident":
        if value not in (-1, 0, 1) or isinstance(value, bool):
            raise ValueError(f"resident must be -1 (never), 0 (the table's choice) or 1 "
                             f"(wherever it runs), got {value!r}")
    elif name == "row_block":
        if not isinstance(value, int) or not (value == 0 or _pow2(value)):
            raise ValueError(f"row_block must be 0 (automatic) or a power of two, got {value!r}")
    elif not isinstance(value, int) or not _pow2(value):
        raise ValueError(f"{name} must be a power of two, got {value!r}")


def parse_bytes(text: str, what: str) -> int:
    """A size in bytes, with an optional binary suffix: 33554432, 32M, 32MiB, 1G; ValueError
    naming `what` for anything else."""
    m = _SIZE.match(text)
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"{what}={text!r}: give a size in bytes, e.g. 33554432 or 32M")
    suffix = (m.group(2) or "")[:1].upper()
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[suffix]


# ---------------------------------------------------------------------------------------
# Parsers: (variable, its stripped non-empty value) -> the field's value; ValueError in one
# line naming the variable. An unset or empty variable takes the field's default unparsed.


def _implementation(name: str, text: str) -> str | None:
    value = text.lower()
    if value == "auto":
        return None
    if value not in IMPLEMENTATIONS:
        raise ValueError(f"${name} must be one of auto, {', '.join(IMPLEMENTATIONS)}; "
                         f"got {value!r}")
    return value


def _zero_or_one(name: str, text: str) -> str:
    if text not in ("0", "1"):
        raise ValueError(f"{name} must be 0, 1 or unset, got {text!r}")
    return text


def _switch(name: str, text: str) -> bool:
    return _zero_or_one(name, text) == "1"


def _numpy(name: str, text: str) -> str:
    if text != "numpy":
        raise ValueError(f"{name} must be numpy or unset, got {text!r}")
    return text


def _launch(name: str, text: str) -> int:
    """A launch option: the LaunchOptions field the variable's name ends in."""
    option = name.removeprefix("ELASTICBENCH_TRITON_").lower()
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"${name}: must be an integer, got {text!r}") from None
    try:
        _check(option, value)
    except ValueError as e:
        raise ValueError(f"${name}: {e}") from None
    return value


def _path(_name: str, text: str) -> Path:
    return Path(text)


def _text(_name: str, text: str) -> str:
    return text


def _bytes(name: str, text: str) -> int:
    return parse_bytes(text, name)


def _megabytes(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{name} must be a number of megabytes >= 0, got {text!r}")
    return value


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, its parser and what it does (one line)."""

    name: str
    parse: Callable[[str, str], Any]
    meaning: str


def _reads(name: str, parse: Callable[[str, str], Any], meaning: str) -> dict[str, Variable]:
    """The metadata of a Settings field read from the variable `name`."""
    return {"variable": Variable(name, parse, meaning)}


@dataclass(frozen=True)
class Settings:
    """What the ELASTICBENCH_* variables say, parsed; a field's default is what an unset or
    empty variable means (None: the reading module's own fallback, named in its meaning)."""

    implementation: str | None = field(default=None, metadata=_reads(
        "ELASTICBENCH_IMPLEMENTATION", _implementation,
        "the implementation every library call runs (cpp, triton, torch; None: the device's "
        "preference, elasticbench.dispatch)"))
    build_dir: Path | None = field(default=None, metadata=_reads(
        "ELASTICBENCH_BUILD_DIR", _path,
        "where the native extension is built (None: $XDG_CACHE_HOME/elasticbench/cpp, "
        "elasticbench.native)"))
    triton_attention_tma: str | None = field(default=None, metadata=_reads(
        "ELASTICBENCH_TRITON_ATTENTION_TMA", _zero_or_one,
        "the Triton attention tile kinds offered: '1' TMA only, '0' pointer only, None both"))
    attention_table: Path | None = field(default=None, metadata=_reads(
        "ELASTICBENCH_ATTENTION_TABLE", _path,
        "a tile-configuration table consulted before the package's own"))
    attention_tune: bool = field(default=False, metadata=_reads(
        "ELASTICBENCH_ATTENTION_TUNE", _switch,
        "time the offered tiles on the first call of a key no table names"))
    triton_max_fused: int = field(default=LaunchOptions.max_fused, metadata=_reads(
        "ELASTICBENCH_TRITON_MAX_FUSED", _launch,
        "the longest row a Triton row kernel holds in registers (a power of two)"))
    triton_chunk: int = field(default=LaunchOptions.chunk, metadata=_reads(
        "ELASTICBENCH_TRITON_CHUNK", _launch,
        "the chunk a streamed row is read in (a power of two)"))
    triton_splits: int = field(default=LaunchOptions.splits, metadata=_reads(
        "ELASTICBENCH_TRITON_SPLITS", _launch,
        "programs per streamed row (0: the launch table's choice)"))
    triton_row_block: int = field(default=LaunchOptions.row_block, metadata=_reads(
        "ELASTICBENCH_TRITON_ROW_BLOCK", _launch,
        "rows one program holds on short rows (0: the launch table's choice)"))
    triton_resident: int = field(default=LaunchOptions.resident, metadata=_reads(
        "ELASTICBENCH_TRITON_RESIDENT", _launch,
        "the resident split path: 0 where the table takes it, 1 wherever it runs, -1 never"))
    triton_exp2_ulps: int = field(default=LaunchOptions.exp2_ulps, metadata=_reads(
        "ELASTICBENCH_TRITON_EXP2_ULPS", _launch,
        "the interpreter's model of the GPU's ex2, in ulps (-1: no model)"))
    torch_device: str = field(default="cpu", metadata=_reads(
        "ELASTICBENCH_TORCH_DEVICE", _text,
        "the device the harness's torch, SDPA and FlexAttention kernels run on"))
    flex_cpu_backward: bool = field(default=False, metadata=_reads(
        "ELASTICBENCH_FLEX_CPU_BACKWARD", _switch,
        "run the FlexAttention baseline's backward on CPU tensors (its eager dense path)"))
    llc_bytes: int | None = field(default=None, metadata=_reads(
        "ELASTICBENCH_LLC_BYTES", _bytes,
        "the host's last-level cache in bytes (None: detected, elasticbench.devices)"))
    cache: Path | None = field(default=None, metadata=_reads(
        "ELASTICBENCH_CACHE", _path,
        "the reference's on-disk cache (None: $XDG_CACHE_HOME/elasticbench)"))
    cache_mb: float = field(default=200.0, metadata=_reads(
        "ELASTICBENCH_CACHE_MB", _megabytes,
        "the most megabytes the reference's cache keeps"))
    reference: str | None = field(default=None, metadata=_reads(
        "ELASTICBENCH_REFERENCE", _numpy,
        "'numpy': the backward reference's sweeps in NumPy even where the native tier is built"))

    @functools.cached_property
    def launch(self) -> LaunchOptions:
        """The Triton launch options these settings give (the defaults that
        `launch_options(...)` blocks and a call's `options=` change)."""
        return LaunchOptions(**{f.name: getattr(self, f"triton_{f.name}")
                                for f in fields(LaunchOptions)})


VARIABLES: dict[str, Field] = {f.metadata["variable"].name: f for f in fields(Settings)}


def parse(name: str, text: str) -> Any:
    """The value the variable `name` set to `text` gives its field (unset or blank: the
    default); ValueError in one line naming the variable for a bad value."""
    f = VARIABLES[name]
    text = text.strip()
    return f.metadata["variable"].parse(name, text) if text else f.default


def read(environ: Mapping[str, str]) -> Settings:
    """The settings `environ` gives (every variable parsed; the first bad one raises)."""
    return Settings(**{f.name: parse(name, environ.get(name, ""))
                       for name, f in VARIABLES.items()})


_current: Settings | None = None  # the process's settings, once read


def settings() -> Settings:
    """The process's settings: read from os.environ at the first call, then kept."""
    return _current or refresh()


def refresh() -> Settings:
    """Read os.environ again (a test or tool that changed it in this process); later
    `settings()` calls return what this returns. A bad value raises and keeps nothing."""
    global _current
    _current = None
    _current = read(os.environ)
    return _current


@contextmanager
def overriding(**changes: Any) -> Iterator[Settings]:
    """Within the block, `settings()` is the process's settings with these fields replaced
    (values as the fields hold them, not as text); the settings before it are back after."""
    global _current
    saved = _current
    _current = replace(settings(), **changes)
    try:
        yield _current
    finally:
        _current = saved
