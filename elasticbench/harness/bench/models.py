"""What a kernel must move and compute: minimum traffic, its own passes, its exponentials.

A kernel declares its pass structure when it is registered (`model=PassModel(...)`, see
elasticbench.harness.passes); kernels that declare nothing are modelled by the minimum: one read,
one write (two reads and one write backward) and the function's exps_per_element.

A kernel that only wraps another (an API kernel: the library's call around a raw kernel,
elasticbench/harness/builtin/row_ops.py and api_kernels.py) may declare which one its call runs here (`wrapped_kernel`), so that
a report can set the two times side by side.
"""

from __future__ import annotations

from collections.abc import Callable

from elasticbench.harness.functions import get_function
from elasticbench.harness.passes import PassModel
from elasticbench.harness.registry import KernelSpec


def minimum_model(function: str, mode: str) -> PassModel:
    """The least any kernel must do: x in, y out (x, y, g in and dx out backward)."""
    exps = get_function(function).exps_per_element
    if mode == "bwd":
        return PassModel("minimum", 3, 1, 0, declared=False)
    return PassModel("minimum", 1, 1, exps, declared=False)


def model_of(spec: KernelSpec) -> PassModel:
    """The kernel's declared model, or the minimum for its function and mode."""
    return spec.model or minimum_model(spec.function, spec.mode)


def minimum_bytes(rows: int, n: int, itemsize: int, mode: str) -> int:
    """2 * n * itemsize a row forward, 3 * n * itemsize backward (docs/benchmarking.md section 1)."""
    per = 3 if mode == "bwd" else 2
    return per * rows * n * itemsize


def model_bytes(model: PassModel, rows: int, n: int, itemsize: int) -> float:
    return (model.reads + model.writes) * rows * n * itemsize


def wrapped_kernel(spec: KernelSpec) -> str | None:
    """The name of the kernel (same function and mode) whose work spec's call wraps on this
    device, as the kernel declares it: `wraps`, a name or a function of no arguments giving
    one (None: none here), on the spec or as an attribute of its function. Resolved when
    called, so a run records what its own device and settings run."""
    declared: str | Callable[[], str | None] | None = (
        getattr(spec, "wraps", None) or getattr(spec.fn, "wraps", None))
    name = declared() if callable(declared) else declared
    if name is not None and not isinstance(name, str):
        raise TypeError(f"kernel {spec.name}: wraps must give a kernel name or None, "
                        f"got {type(name).__name__}")
    return name or None
