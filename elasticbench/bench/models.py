"""What a kernel must move and compute: minimum traffic, its own passes, its exponentials.

A kernel declares its pass structure with the `passes` decorator (any kernel file may):

    @register_kernel(function="elastic", backend="torch")
    @passes("three-pass", reads=3, writes=1, exps=2)
    def my_kernel(x, *, tau, beta): ...

reads/writes count full sweeps over the (rows, n) array; exps counts exponentials per
element. Kernels that declare nothing are modelled by the minimum: one read, one write
(two reads and one write backward) and the function's exps_per_element.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..functions import get_function
from ..registry import KernelSpec

PASS_ATTRIBUTE = "__elasticbench_passes__"


@dataclass(frozen=True)
class PassModel:
    """Sweeps over memory and exponentials per element of one kernel."""

    structure: str
    reads: float
    writes: float
    exps: float
    declared: bool = True
    compute: str | None = None  # dtype the exponentials run in, when not the usual one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def passes(structure: str, *, reads: float, writes: float, exps: float,
           compute: str | None = None) -> Callable:
    """Decorator: declare a kernel's pass structure (see the module docstring)."""
    if reads < 1 or writes < 1 or exps < 0:
        raise ValueError("a kernel reads and writes at least once and computes exps >= 0")

    def deco(fn: Callable) -> Callable:
        setattr(fn, PASS_ATTRIBUTE, PassModel(structure, reads, writes, exps, True, compute))
        return fn

    return deco


def minimum_model(function: str, mode: str) -> PassModel:
    """The least any kernel must do: x in, y out (x, y, g in and dx out backward)."""
    exps = get_function(function).exps_per_element
    if mode == "bwd":
        return PassModel("minimum", 3, 1, 0, declared=False)
    return PassModel("minimum", 1, 1, exps, declared=False)


def model_of(spec: KernelSpec) -> PassModel:
    """The kernel's declared model, or the minimum for its function and mode."""
    declared = getattr(spec.fn, PASS_ATTRIBUTE, None)
    return declared if isinstance(declared, PassModel) else minimum_model(spec.function, spec.mode)


def minimum_bytes(rows: int, n: int, itemsize: int, mode: str) -> int:
    """2 * n * itemsize a row forward, 3 * n * itemsize backward (docs/benchmarking.md section 1)."""
    per = 3 if mode == "bwd" else 2
    return per * rows * n * itemsize


def model_bytes(model: PassModel, rows: int, n: int, itemsize: int) -> float:
    return (model.reads + model.writes) * rows * n * itemsize
