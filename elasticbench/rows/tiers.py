"""The implementations of the exp family's rows and the choice of one per call.

`choose(x, spec)` runs elasticbench.dispatch's preference for x's device over three
implementations of rows.spec's contract: the native C++ kernels (`rows.native_rows`, CPU), the
Triton kernels (kernels/triton/tier.py, CUDA, or CPU tensors under Triton's interpreter when
forced) and the torch code (`TORCH`, which takes everything). The autograd function keeps the
chosen implementation for its backward (rows.ops).
"""

from __future__ import annotations

import functools

import torch

from ..dispatch import Implementation
from ..dispatch import choose as dispatch_choose
from . import native_rows
from .exp_normalize import exp_normalize_backward, exp_normalize_forward
from .spec import Backward, ExpSpec


def _torch_forward(x: torch.Tensor, spec: ExpSpec) -> torch.Tensor:
    return exp_normalize_forward(x, spec.keep(x), spec.tau, spec.offset, spec.floor)


def _torch_backward(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, spec: ExpSpec,
                    params: bool) -> Backward:
    return exp_normalize_backward(x, y, g, spec.keep(x), spec.tau, spec.offset, spec.floor,
                                  params)


TORCH = Implementation("torch", lambda x, spec: True, _torch_forward, _torch_backward)


@functools.lru_cache(maxsize=1)
def _triton() -> Implementation | None:
    """The Triton rows, or None where Triton does not import here."""
    try:
        from ..kernels.triton.tier import TRITON
    except ImportError:
        return None
    return TRITON


def implementation(name: str) -> Implementation | None:
    """The rows' implementation called `name`, None where it is not available here."""
    if name == "cpp":
        return native_rows.CPP if native_rows.extension() is not None else None
    if name == "triton":
        return _triton()
    return TORCH if name == "torch" else None


def choose(x: torch.Tensor, spec: ExpSpec) -> Implementation:
    """The implementation that computes spec on x (its backward too)."""
    return dispatch_choose(x.device, implementation, x, spec)
