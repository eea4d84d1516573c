"""The Triton tier of the autograd path (elasticbench.rows.tiers): Elastic-Softmax on CUDA
tensors with one tau and beta for every row; softmax and softmax1 take the torch code.

Importing this module registers the tier with elasticbench.rows and no kernel with the
registry (that is triton_kernels's job); Triton itself is imported on the first CUDA
tensor, and where it does not import the tier declines and the torch code serves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from elasticbench.rows.tiers import Backward, ExpSpec, Tier, register_tier


class Kernels(NamedTuple):
    forward: Callable[..., torch.Tensor]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@functools.lru_cache(maxsize=1)
def kernels() -> Kernels | None:
    """The Triton kernels (elastic_forward, elastic_backward), or None where Triton fails."""
    try:
        from .elastic_backward import elastic_backward
        from .exp_family import elastic_forward
    except Exception:  # absent, or Triton unusable here: the torch code serves
        return None
    return Kernels(elastic_forward, elastic_backward)


def accepts(x: torch.Tensor, spec: ExpSpec) -> bool:
    """Elastic-Softmax (the kernels mask negatives) on CUDA tensors, scalar tau and beta."""
    return x.is_cuda and spec.mask_negative and spec.scalar() and kernels() is not None


def forward(x: torch.Tensor, spec: ExpSpec) -> torch.Tensor:
    k = kernels()
    assert k is not None and spec.offset is not None
    shape = x.shape
    y = k.forward(x.reshape(-1, shape[-1]).contiguous(), float(spec.tau), float(spec.offset))
    return y.reshape(shape)


def backward(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, spec: ExpSpec,
             params: bool) -> Backward:
    """dx, and dtau and dbeta summed over every row (shape (1,)), whatever `params`."""
    k = kernels()
    assert k is not None and spec.offset is not None
    n = x.shape[-1]
    dx, dtau, dbeta = k.backward(y.reshape(-1, n), g.reshape(-1, n).contiguous(),
                                 x.reshape(-1, n).contiguous(), float(spec.tau),
                                 float(spec.offset))
    return (dx.reshape(x.shape), torch.as_tensor(dtau, device=x.device).reshape(1),
            torch.as_tensor(dbeta, device=x.device).reshape(1))


TRITON = register_tier(Tier("triton", accepts, forward, backward))
