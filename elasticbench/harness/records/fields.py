"""Typed records <-> plain JSON objects: every field checked against its declared type.

A record type is a keyword-only dataclass whose fields are declared with `entry`. Reading a
record (`from_dict`) checks each field against its annotation (str, int, float, bool, None,
unions, Literal, list, tuple (tuple[T, ...] too), dict[str, ...], nested record types, Any) and against the
entry's `check`, which is applied to every number under the field; floats must be finite
unless the entry says `nonfinite` (then 'nan', 'inf' and '-inf', as results files store
them, are read back as floats). Writing (`to_dict`) leaves out optional fields (those whose
default is None) while they are None, so a new optional field is one line and older files,
which lack it, still read.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

Check = Callable[[float], str | None]  # a number -> what is wrong with it, or None
R = TypeVar("R")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class RecordError(ValueError):
    """A JSON object that is not a valid record: `field` is the path, `problem` says why."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class Meta:
    check: Check | None = None
    nonfinite: bool = False
    timed: bool = False  # measured: a run record has it unless the kernel raised (reports
    # need every timed field of a record that did not raise)


def entry(default: Any = MISSING, *, check: Check | None = None, nonfinite: bool = False,
          timed: bool = False, factory: Callable[[], Any] | None = None) -> Any:
    """Declare a record field (see the module docstring)."""
    meta = {"record": Meta(check, nonfinite, timed)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# Checks, applied to every number under a field.
def positive(v: float) -> str | None:
    return None if v > 0 else f"must be > 0, got {v!r}"


def nonnegative(v: float) -> str | None:
    return None if v >= 0 else f"must be >= 0, got {v!r}"


MAX_SECONDS = 86400.0  # one call timed at more than a day is not a measurement


def duration_s(v: float) -> str | None:
    """A time in seconds: >= 0 and at most a day."""
    return None if 0 <= v <= MAX_SECONDS else f"must be a time between 0 and 1 day, got {v!r}"


def duration_ns(v: float) -> str | None:
    """A time in nanoseconds: >= 0 and at most a day."""
    return (None if 0 <= v <= MAX_SECONDS * 1e9
            else f"must be a time between 0 and 1 day in ns, got {v!r}")


def _meta(f: dataclasses.Field) -> Meta:
    return f.metadata.get("record", Meta())


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def optional(f: dataclasses.Field) -> bool:
    """Whether a field may be left out of the JSON object (it has a default)."""
    return f.default is not MISSING or f.default_factory is not MISSING


@cache
def timed_names(cls: type) -> tuple[str, ...]:
    """The measured fields of a record type (see Meta.timed)."""
    return tuple(f.name for f in fields(cls) if _meta(f).timed)


class JSONRecord:
    """Base of every record type: to_dict and from_dict as methods."""

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls: type[R], data: Any) -> R:
        return from_dict(cls, data)


def to_dict(record: Any) -> dict[str, Any]:
    """The JSON object of a record; optional fields that are None are left out."""
    out: dict[str, Any] = {}
    for f in fields(record):
        v = getattr(record, f.name)
        if v is None and f.default is None:
            continue
        out[f.name] = _plain(v)
    return out


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return to_dict(v)
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def from_dict(cls: type[R], data: Any, path: str = "") -> R:
    """A record of type cls from its JSON object; RecordError names the first bad field.

    Keys the type does not declare are ignored (a newer writer's fields)."""
    if not isinstance(data, dict):
        raise RecordError(path, f"must be an object, got {_show(data)}")
    missing = [f.name for f in fields(cls) if not optional(f) and f.name not in data]
    if missing:
        raise RecordError(path, f"lacks {', '.join(missing)}")
    hints = _hints(cls)
    kw = {f.name: _convert(hints[f.name], data[f.name], _join(path, f.name), _meta(f))
          for f in fields(cls) if f.name in data}
    try:
        return cls(**kw)
    except RecordError as e:  # a check across fields, in the type's __post_init__
        raise RecordError(_join(path, e.field), e.problem) from None
    except (TypeError, ValueError) as e:  # a plain dataclass's own check of its fields
        raise RecordError(path, str(e).splitlines()[0]) from None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path and name else path or name


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _convert(tp: Any, v: Any, path: str, meta: Meta) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return v
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        errors = []
        for a in (a for a in args if a is not type(None)):
            try:
                return _convert(a, v, path, meta)
            except RecordError as e:
                errors.append(e)
        raise errors[0] if len(errors) == 1 else RecordError(
            path, f"unexpected value {_show(v)}")
    if origin is Literal:
        if v in args:
            return v
        raise RecordError(path, f"must be one of {', '.join(map(repr, args))}, got {_show(v)}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, v, path)
    if origin is list:
        if not isinstance(v, list):
            raise RecordError(path, f"must be a list, got {_show(v)}")
        return [_convert(args[0], x, f"{path}[{i}]", meta) for i, x in enumerate(v)]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # tuple[T, ...]
        if not isinstance(v, list | tuple):
            raise RecordError(path, f"must be a list, got {_show(v)}")
        return tuple(_convert(args[0], x, f"{path}[{i}]", meta) for i, x in enumerate(v))
    if origin is tuple:
        if not isinstance(v, list | tuple) or len(v) != len(args):
            raise RecordError(path, f"must be a list of {len(args)}, got {_show(v)}")
        return tuple(_convert(a, x, f"{path}[{i}]", meta)
                     for i, (a, x) in enumerate(zip(args, v, strict=True)))
    if origin is dict:
        if not isinstance(v, dict):
            raise RecordError(path, f"must be an object, got {_show(v)}")
        return {k: _convert(args[1], x, _join(path, str(k)), meta) for k, x in v.items()}
    if tp is bool:
        if isinstance(v, bool):
            return v
        raise RecordError(path, f"must be true or false, got {_show(v)}")
    if tp is str:
        if isinstance(v, str):
            return v
        raise RecordError(path, f"must be a string, got {_show(v)}")
    if tp is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return _checked(v, path, meta)
        raise RecordError(path, f"must be an integer, got {_show(v)}")
    if tp is float:
        return _checked(_number(v, path, meta), path, meta)
    raise TypeError(f"record field {path}: unsupported type {tp!r}")


def _number(v: Any, path: str, meta: Meta) -> float:
    if meta.nonfinite and isinstance(v, str) and v in _NONFINITE:
        return _NONFINITE[v]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RecordError(path, f"must be a number, got {_show(v)}")
    try:
        x = float(v)
    except OverflowError:
        raise RecordError(path, f"must be a finite number, got {_show(v)}") from None
    if not math.isfinite(x) and not meta.nonfinite:
        raise RecordError(path, f"must be a finite number, got {_show(v)}")
    return x


def _checked(v: float, path: str, meta: Meta) -> Any:
    if meta.check is not None and not (isinstance(v, float) and math.isnan(v)):
        problem = meta.check(v)
        if problem:
            raise RecordError(path, problem)
    return v
