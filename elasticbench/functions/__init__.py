"""The function family, each member defined once (see docs/definitions.md)."""

from __future__ import annotations

from . import elastic, softmax, softmax1, stablemax, symax
from .base import Function, Param, RowTruth

FUNCTIONS: dict[str, Function] = {
    m.FUNCTION.name: m.FUNCTION for m in (elastic, softmax, softmax1, stablemax, symax)
}
FUNCTION_NAMES: tuple[str, ...] = tuple(FUNCTIONS)


def get_function(name: str) -> Function:
    """Look a function up by name; ValueError names the choices."""
    try:
        return FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown function {name!r} (choose from {', '.join(FUNCTION_NAMES)})"
        ) from None


__all__ = ["FUNCTIONS", "FUNCTION_NAMES", "Function", "Param", "RowTruth", "get_function"]
