"""The function family, each member defined once (see docs/definitions.md), and the
attention functions built on them (docs/attention.md). functions/sigmoid.py defines the
sigmoid weight and functions/cog.py the signed cog weight, which only attention takes
(`sigmoid_attention`, `cog_attention`): they are no row functions of the rows kind
(docs/attention.md section 9 says why)."""

from __future__ import annotations

from elasticbench.harness.functions import elastic, softmax, softmax1, stablemax, symax
from elasticbench.harness.functions.attention_functions import (
    ATTENTION_FUNCTIONS,
    AttentionFunction,
)
from elasticbench.harness.functions.definition import Function, Param, RowTruth

FUNCTIONS: dict[str, Function] = {
    m.FUNCTION.name: m.FUNCTION for m in (elastic, softmax, softmax1, stablemax, symax)
}
FUNCTION_NAMES: tuple[str, ...] = tuple(FUNCTIONS)

ROW, ATTENTION = "row", "attention"  # the kinds of kernel function


def get_function(name: str) -> Function:
    """Look a row function up by name; ValueError names the choices."""
    try:
        return FUNCTIONS[name]
    except KeyError:
        hint = (f"; {name} is an attention function" if name in ATTENTION_FUNCTIONS else "")
        raise ValueError(
            f"unknown function {name!r} (choose from {', '.join(FUNCTION_NAMES)}){hint}"
        ) from None


def get_attention_function(name: str) -> AttentionFunction:
    """Look an attention function up by name; ValueError names the choices."""
    try:
        return ATTENTION_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown attention function {name!r} (choose from "
                         f"{', '.join(ATTENTION_FUNCTIONS)})") from None


def function_kind(name: str) -> str:
    """ROW or ATTENTION for any kernel function's name; ValueError names every choice."""
    if name in FUNCTIONS:
        return ROW
    if name in ATTENTION_FUNCTIONS:
        return ATTENTION
    raise ValueError(f"unknown function {name!r} (choose from "
                     f"{', '.join((*FUNCTION_NAMES, *ATTENTION_FUNCTIONS))})")


__all__ = ["ATTENTION", "ATTENTION_FUNCTIONS", "FUNCTIONS", "FUNCTION_NAMES", "ROW",
           "AttentionFunction", "Function", "Param", "RowTruth", "function_kind",
           "get_attention_function", "get_function"]
