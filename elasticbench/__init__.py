"""elasticbench: numerics verification and roofline benchmarking for the softmax family.

Importing the package imports nothing else: the library (elasticbench.functional,
elasticbench.nn) must load without the harness that judges it (docs/dispatch.md
section 1). The harness's names a kernel file uses, `register_kernel`,
`KernelSpec`, `list_kernels`, `load_kernel_file` and `PassModel`, are imported on first
access (PEP 562), so `from elasticbench import register_kernel` works as before.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Each lazily imported name and the harness module that defines it.
_HARNESS = {
    "KernelSpec": "harness.kernel_spec",
    "register_kernel": "harness.kernel_spec",
    "PassModel": "harness.passes",
    "list_kernels": "harness.registry",
    "load_kernel_file": "harness.registry",
}

__all__ = ["KernelSpec", "PassModel", "__version__", "list_kernels", "load_kernel_file",
           "register_kernel"]


def __getattr__(name: str) -> Any:
    """The harness's public names, imported the first time one is asked for; AttributeError
    for any other missing name (a submodule not imported yet stays one, as without this)."""
    module = _HARNESS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HARNESS})
