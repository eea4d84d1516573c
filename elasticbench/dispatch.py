"""Which implementation runs a call of the library's ops, shared by rows and attention.

Every op of elasticbench.functional (the Elastic-Softmax rows, Elastic attention) has a few
implementations behind one contract: the native C++ kernels (`cpp`), the Triton kernels
(`triton`) and the torch code (`torch`), which takes everything. A call runs the first in
the preference of its device that accepts it:

    CPU tensors    cpp, torch
    CUDA tensors   triton, torch
    anything else  torch

$ELASTICBENCH_IMPLEMENTATION (cpp, triton or torch; empty or `auto`: the preference above)
forces one for every device: `torch` is the reference path, and `triton` on CPU tensors
runs the Triton kernels in Triton's interpreter (TRITON_INTERPRET=1), which is how the
CUDA path is tested on a machine without a GPU. A forced implementation that declines a
call (a dtype its kernels do not take) leaves it to the torch code. The forward and the
backward of one call run the same implementation (docs/dispatch.md).

The variable is read with the others, once (elasticbench.settings), and kept: a call reads
no environment. Code that changes it in the process afterwards calls
`elasticbench.settings.refresh()` after each change, or forces an implementation for a block
with `forcing(name)` (docs/dispatch.md section 2, "Reading the environment").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _python_dispatch

from elasticbench.settings import overriding, parse, settings

IMPLEMENTATION_ENV = "ELASTICBENCH_IMPLEMENTATION"
PREFERENCE = {"cpu": ("cpp", "torch"), "cuda": ("triton", "torch")}


@dataclass(frozen=True)
class Implementation:
    """One implementation of an op's contract; accepts(*args) says whether it takes a call
    (called with the op's own arguments, as forward is)."""

    name: str
    accepts: Callable[..., bool]
    forward: Callable[..., Any]
    backward: Callable[..., Any]


def forced() -> str | None:
    """The implementation $ELASTICBENCH_IMPLEMENTATION forces, None for the preference (as
    the process's settings read it); ValueError in one line for any other value."""
    return settings().implementation


@contextmanager
def forcing(name: str | None) -> Iterator[None]:
    """Calls within the block run `name` (cpp, triton or torch; None or "auto": the
    preference), whatever the variable says; what it says is back on leaving. A bad name
    raises ValueError before anything changes."""
    with overriding(implementation=parse(IMPLEMENTATION_ENV, name or "")):
        yield


def preference(device: torch.device) -> tuple[str, ...]:
    """The implementations a call on `device` may run, in order; `torch` always last."""
    first = forced()
    if first is None:
        return PREFERENCE.get(device.type, ("torch",))
    return (first, "torch") if first != "torch" else ("torch",)


def choose(device: torch.device, lookup: Callable[[str], Implementation | None],
           *args: Any) -> Implementation:
    """The first implementation in `device`'s preference that is available here (lookup
    gives None where it is not) and accepts args."""
    for name in preference(device):
        impl = lookup(name)
        if impl is not None and impl.accepts(*args):
            return impl
    raise LookupError(f"no implementation takes this call (tried {preference(device)})")


def traced(x: torch.Tensor) -> bool:
    """Whether a call on x is being traced (torch.compile, torch.export, make_fx, fake
    tensors) rather than run: traced calls go through the registered custom ops, which those
    tools see as one opaque operator; eager calls go straight to the autograd function, which
    costs a fraction of the custom op's dispatch."""
    if torch.compiler.is_compiling() or type(x) not in (torch.Tensor, torch.nn.Parameter):
        return True
    if not _python_dispatch.is_in_torch_dispatch_mode():
        return False
    return any(mode.is_infra_mode() for mode in _python_dispatch._get_current_dispatch_mode_stack())
