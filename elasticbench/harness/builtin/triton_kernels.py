"""The built-in Triton kernels, registered under the backend `triton`.

The kernels' code lives in `elasticbench.kernels.triton` (importing it registers nothing);
this module only names the wrappers to the registry. Each takes a 2-D (rows, n) fp32, fp16
or bf16 tensor and launches with the current `LaunchOptions` (docs/triton.md).
"""

from __future__ import annotations

import torch

from elasticbench.harness.kernel_spec import register_kernel
from elasticbench.kernels.triton.elastic_backward import elastic_backward
from elasticbench.kernels.triton.exp_family import (
    elastic_forward,
    softmax1_forward,
    softmax_forward,
)
from elasticbench.kernels.triton.launch import DTYPES
from elasticbench.kernels.triton.weight_family import stablemax_forward, symax_forward


@register_kernel(function="elastic", backend="triton", dtypes=DTYPES, name="triton_elastic")
def triton_elastic(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Elastic-Softmax in Triton: NVM mask, shift by the kept max, beta rescaled by exp(-m/tau)."""
    return elastic_forward(x, tau, beta)


@register_kernel(function="softmax", backend="triton", dtypes=DTYPES, name="triton_softmax")
def triton_softmax(x: torch.Tensor) -> torch.Tensor:
    """Safe softmax in Triton: shifted by the max; an all -inf row gives zeros."""
    return softmax_forward(x)


@register_kernel(function="softmax1", backend="triton", dtypes=DTYPES, name="triton_softmax1")
def triton_softmax1(x: torch.Tensor) -> torch.Tensor:
    """Softmax1 in Triton: shift m = max(max x, 0), the 1 rescaled to exp(-m)."""
    return softmax1_forward(x)


@register_kernel(function="stablemax", backend="triton", dtypes=DTYPES, name="triton_stablemax")
def triton_stablemax(x: torch.Tensor) -> torch.Tensor:
    """Stablemax in Triton, weights scaled by a power of two near the row maximum."""
    return stablemax_forward(x)


@register_kernel(function="symax", backend="triton", dtypes=DTYPES, name="triton_symax")
def triton_symax(x: torch.Tensor, *, eta: float) -> torch.Tensor:
    """Symax in Triton: |x| / (eta + sum |x|), scaled by a power of two near max |x|."""
    return symax_forward(x, eta)


@register_kernel(function="elastic", backend="triton", dtypes=DTYPES, name="triton_elastic",
                 mode="bwd")
def triton_elastic_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, *, tau: float,
                       beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Elastic-Softmax backward in Triton: dx, and dtau, dbeta summed over the whole tensor."""
    return elastic_backward(y, g, x2d=x, tau=tau, beta=beta)
