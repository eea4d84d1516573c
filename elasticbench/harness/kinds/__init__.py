"""The kinds of kernel, each one entry (kinds/kind.py says what a kind owns): the commands
ask here which kind a set of kernels or a case file is, then ask that kind."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from elasticbench.harness.kinds.attention.attention_kind import ATTENTION_KIND
from elasticbench.harness.kinds.kind import Kind, RunOptions, VerifyOptions
from elasticbench.harness.kinds.row_kind import ROWS
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.verify.tables import read_toml

KINDS: dict[str, Kind] = {k.name: k for k in (ROWS, ATTENTION_KIND)}


def kind_of(kernels: Iterable[KernelSpec]) -> Kind:
    """The one kind of these kernels; ValueError when they are of several."""
    kinds = [KINDS[name] for name in dict.fromkeys(k.kind for k in kernels)]
    if len(kinds) > 1:
        names = " kernels and ".join(k.name for k in KINDS.values() if k in kinds)
        raise ValueError(f"{names} kernels are verified apart: choose them with --function "
                         "(or --only) one kind at a time")
    return kinds[0] if kinds else ROWS


def kind_of_case(path: Path) -> Kind:
    """The kind whose run table the case file holds (rows, whose loader says what is
    missing, when it holds none); CaseFileError when it cannot be read."""
    tables = set(read_toml(path))
    return next((k for k in KINDS.values() if k.run_table in tables), ROWS)


__all__ = ["KINDS", "Kind", "RunOptions", "VerifyOptions", "kind_of", "kind_of_case"]
