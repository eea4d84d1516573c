"""torch.softmax itself as a kernel: accurate, but an all -inf row gives NaN (pytorch #25110)
where fused attention kernels (and this suite's policy) give zeros."""

import torch

from elasticbench import register_kernel


@register_kernel(function="softmax", backend="torch", name="torch_softmax_vendor")
def torch_softmax_vendor(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax along the last axis, as shipped (fp32 accumulation for fp16/bf16)."""
    return torch.softmax(x, dim=-1)
