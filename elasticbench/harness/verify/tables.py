"""Case files: reading one, and reading a table of it into a typed record (a dataclass whose
fields are checked as records/fields.py checks a results file's), so that a bad case file
gets one line naming the file, the table and the key."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

import tomllib

from elasticbench.harness.records.fields import RecordError, from_dict

R = TypeVar("R")
T = TypeVar("T")
Grid = dict[str, Any]  # a parameter -> its value or list of values, checked by its function


class CaseFileError(ValueError):
    """A case file is missing, unreadable or says something invalid."""


def read_toml(path: Path) -> dict[str, Any]:
    """The whole case file; CaseFileError when it is missing, unreadable or not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise CaseFileError(f"case file {path} does not exist") from None
    except OSError as e:
        raise CaseFileError(f"case file {path} cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise CaseFileError(f"case file {path} is not valid TOML: {e}") from None


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


@cache
def _keys(cls: type) -> frozenset[str]:
    """The keys a table of record type cls may hold: its fields set at construction."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def _unknown_key(cls: type, table: dict[str, Any], path: str,
                 given: frozenset[str] = frozenset()) -> str | None:
    """The first key of table (or of a table under it) that cls does not declare, or that
    the caller gives, as the message that says so; None when there is none."""
    hints = _hints(cls)
    for key in sorted(table):
        if key not in _keys(cls) or key in given:
            known = ", ".join(sorted(f.name for f in dataclasses.fields(cls)
                                     if f.init and f.name not in given))
            return f"[{path}] has no key {key!r} (keys: {known})"
        found = _unknown_below(hints[key], table[key], f"{path}.{key}")
        if found:
            return found
    return None


def _unknown_below(tp: Any, value: Any, path: str) -> str | None:
    """_unknown_key for the tables under a key: one of record type tp, or a list of them."""
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return _unknown_key(tp, value, path)  # type: ignore[arg-type]
    args = get_args(tp)
    if get_origin(tp) in (list, tuple) and args and isinstance(value, list):
        return next((found for i, item in enumerate(value)
                     if (found := _unknown_below(args[0], item, f"{path}[{i}]"))), None)
    return None


def read_table(cls: type[R], table: Any, where: str, table_name: str, **given: Any) -> R:
    """Table `table_name` of case file `where` as a record of type cls (the fields in
    `given` set by the caller, not the file): CaseFileError, one line, for a table that is
    missing, has a key cls does not declare, or a value not of its field's type or range."""
    if not isinstance(table, dict):
        raise CaseFileError(f"{where}: no [{table_name}] table")
    unknown = _unknown_key(cls, table, table_name, frozenset(given))
    if unknown:
        raise CaseFileError(f"{where}: {unknown}")
    try:
        return from_dict(cls, {**table, **given})
    except RecordError as e:
        raise CaseFileError(f"{where}: {table_name}{'.' if e.field else ': '}{e}") from None


def checked(key: str, check: Callable[..., T], *args: Any) -> T:
    """check(*args), its ValueError turned into a RecordError of field `key` (for a record
    type's __post_init__: read_table then names the key)."""
    try:
        return check(*args)
    except ValueError as e:
        raise RecordError(key, str(e)) from None


def param_grids(value: dict[str, Grid], function: Callable[[str], Any]
                ) -> dict[str, dict[str, list[float]]]:
    """A `params` table: each function's (looked up by `function`) parameter grid, as lists,
    every name and value checked by the function."""
    out: dict[str, dict[str, list[float]]] = {}
    for fname, grid in value.items():
        fn = checked(f"params.{fname}", function, fname)
        lists = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
        try:
            fn.param_grid(lists)  # validates names and values
            for k in lists:
                fn.validate_params({k: lists[k][0]})
        except (ValueError, IndexError) as e:
            raise RecordError(f"params.{fname}", str(e)) from None
        out[fname] = lists
    return out
