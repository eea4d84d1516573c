"""The Triton implementation of the exp family's rows (elasticbench.rows.tiers): Elastic-Softmax
on fp32, fp16 and bf16 tensors, with tau and beta floats or tensors (0-d, or one per row:
per head, per batch) that the kernels read from device memory, so a call reads nothing back
to the host and launches the same kernels whatever the parameters hold (params.py). The
backward returns dtau and dbeta per row, or their totals for 0-d parameters, reduced on the
device; softmax and softmax1 take the torch code.

It takes CUDA tensors, and CPU tensors where Triton runs in its interpreter
(TRITON_INTERPRET=1: how the CUDA path is tested without a GPU). Triton itself is imported
on the first call; where it does not import, the implementation declines and the torch
code serves. Tensors are trusted to hold tau > 0 and beta >= 0 (elasticbench.functional
checks floats; elasticbench.nn keeps its parameters in range).
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from elasticbench.devices import triton_interpreted
from elasticbench.dispatch import Implementation
from elasticbench.rows.spec import Backward, ExpSpec

from . import launch  # launch imports no Triton
from .launch import SUPPORTED_DTYPES


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[ModuleType, ModuleType] | None:
    """The forward and backward kernel modules, or None where Triton fails here."""
    try:
        from . import elastic_backward, exp_family
    except Exception:  # absent, or Triton unusable here: the torch code serves
        return None
    return exp_family, elastic_backward


def accepts(x: torch.Tensor, spec: ExpSpec) -> bool:
    """Elastic-Softmax (the kernels mask negatives) of an fp32/fp16/bf16 tensor on a CUDA
    device, or on the CPU under the interpreter; float64 takes the torch code."""
    return (spec.mask_negative and x.dtype in SUPPORTED_DTYPES
            and (x.is_cuda or (x.device.type == "cpu" and triton_interpreted()))
            and _kernels() is not None)


_CONSTANTS: dict[tuple[torch.device, float], torch.Tensor] = {}
MAX_CONSTANTS = 64  # distinct float parameters remembered; past that the table starts again


def _tensor(v: float | torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """A parameter as the kernels read it: a tensor stays; a float (where the other
    parameter is a tensor) becomes a 0-d fp32 tensor on x's device, filled there once per
    value and device and then reused, so a call launches no fill kernel for it. Under
    CUDA-graph capture it is filled in the graph instead (a tensor first made there belongs
    to the graph's memory pool), and not remembered."""
    if isinstance(v, torch.Tensor):
        return v.detach()
    value = 0.0 if v is None else float(v)
    if launch.capturing(x.device):
        return torch.full((), value, dtype=torch.float32, device=x.device)
    key = (x.device, value)
    have = _CONSTANTS.get(key)
    if have is None:
        if len(_CONSTANTS) >= MAX_CONSTANTS:
            _CONSTANTS.clear()
        have = _CONSTANTS[key] = torch.full((), value, dtype=torch.float32, device=x.device)
    return have


def _floats(spec: ExpSpec) -> bool:
    return not isinstance(spec.tau, torch.Tensor) and not isinstance(spec.offset, torch.Tensor)


def forward(x: torch.Tensor, spec: ExpSpec) -> torch.Tensor:
    fwd, _ = _kernels()  # type: ignore[misc]
    xc = x.contiguous()
    if _floats(spec):  # the launch's own scalars
        n = x.shape[-1] if x.ndim else 1
        return fwd.elastic_forward(xc.reshape(-1, n), float(spec.tau),
                                   float(spec.offset or 0.0)).reshape(x.shape)
    return fwd.elastic_forward_params(xc, _tensor(spec.tau, x), _tensor(spec.offset, x))


def backward(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, spec: ExpSpec,
             params: bool) -> Backward:
    """dx, and dtau and dbeta per row ((..., 1)) or summed (shape (1,)); None unless
    `params`."""
    _, bwd = _kernels()  # type: ignore[misc]
    if _floats(spec):  # no parameter gradient is wanted of floats
        n = x.shape[-1] if x.ndim else 1
        dx, _, _ = bwd.elastic_backward(*(t.reshape(-1, n) for t in (y, g, x)), float(spec.tau),
                                        float(spec.offset or 0.0))
        return dx.reshape(x.shape), None, None
    dx, dtau, dbeta = bwd.elastic_backward_params(x, y, g, _tensor(spec.tau, x),
                                                  _tensor(spec.offset, x))
    return (dx, dtau, dbeta) if params else (dx, None, None)


TRITON = Implementation("triton", accepts, forward, backward)
