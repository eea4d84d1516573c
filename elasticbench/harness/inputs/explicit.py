"""Inputs written out value by value: a reproducer that a case file carries whole.

A generator re-creates its input from a seed; an explicit input is the values themselves,
as `elasticbench hunt` saves a shrunk failure. Two forms, either in a case file's input:
whole rows (`values = [[...], ...]`), or a fill value with a few cells set
(`fill = 0.0`, `set = [[row, column, value], ...]`). Values are rounded to the case's format
(a hunt writes values that are exact in it, so nothing moves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from elasticbench.harness.numerics.dtypes import get_format


@dataclass(frozen=True)
class Explicit:
    """The values of one input: whole rows, or a fill and cells (row, column, value)."""

    shape: tuple[int, int]
    fill: float = 0.0
    cells: tuple[tuple[int, int, float], ...] = ()
    rows: tuple[tuple[float, ...], ...] | None = None

    def array(self, dtype: str) -> np.ndarray:
        """The input in format dtype."""
        if self.rows is not None:
            x = np.array(self.rows, dtype=np.float64)
        else:
            x = np.full(self.shape, self.fill, dtype=np.float64)
            for r, c, v in self.cells:
                x[r, c] = v
        with np.errstate(over="ignore"):
            return get_format(dtype).cast(x)

    @classmethod
    def of(cls, x: np.ndarray) -> Explicit:
        """The shortest description of x: its commonest value as the fill and the other
        cells set, or whole rows when that is no shorter."""
        x64 = np.asarray(x, dtype=np.float64)
        shape = (int(x64.shape[0]), int(x64.shape[1]))
        bits = x64.view(np.uint64)
        values, counts = np.unique(bits, return_counts=True)
        fill_bits = values[np.argmax(counts)]
        fill = float(np.array([fill_bits], dtype=np.uint64).view(np.float64)[0])
        where = np.argwhere(bits != fill_bits)
        if 3 * len(where) < x64.size:
            cells = tuple((int(r), int(c), float(x64[r, c])) for r, c in where)
            return cls(shape, fill, cells)
        return cls(shape, rows=tuple(tuple(float(v) for v in row) for row in x64))

    def toml_fields(self) -> dict[str, Any]:
        """The case-file keys that describe these values (see parse)."""
        if self.rows is not None:
            return {"values": [list(r) for r in self.rows]}
        return {"shape": list(self.shape), "fill": self.fill,
                "set": [[r, c, v] for r, c, v in self.cells]}


def parse(item: dict[str, Any], where: str) -> Explicit:
    """An input's explicit values from its case-file keys; ValueError says what is wrong."""
    if "values" in item:
        rows = item["values"]
        if (not isinstance(rows, list) or not rows
                or not all(isinstance(r, list) and r for r in rows)
                or len({len(r) for r in rows}) != 1):
            raise ValueError(f"{where}: values must be a non-empty list of rows of equal length")
        out = tuple(tuple(_number(v, where) for v in r) for r in rows)
        return Explicit((len(out), len(out[0])), rows=out)
    shape = item.get("shape")
    if (not isinstance(shape, list) or len(shape) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape)):
        raise ValueError(f"{where}: an input given by fill and set needs shape = [rows, n]")
    cells = []
    for cell in item.get("set", []):
        if not (isinstance(cell, list) and len(cell) == 3 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in cell[:2])):
            raise ValueError(f"{where}: each set entry is [row, column, value], got {cell!r}")
        r, c = cell[0], cell[1]
        if not (0 <= r < shape[0] and 0 <= c < shape[1]):
            raise ValueError(f"{where}: set entry {cell!r} is outside the shape {shape}")
        cells.append((r, c, _number(cell[2], where)))
    return Explicit((shape[0], shape[1]), _number(item.get("fill", 0.0), where), tuple(cells))


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{where}: values must be numbers (inf and nan allowed), got {v!r}")
    return float(v)


def toml_value(v: Any) -> str:
    """v written as TOML (numbers, strings, lists, inline tables): floats round-trip exactly."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(e) for e in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(e)}" for k, e in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")
