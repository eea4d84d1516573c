"""SDPA pinned to one of its backends: `sdpa_cudnn` and `sdpa_flash`, vendor baselines.

`sdpa` (elasticbench/harness/builtin/torch_attention.py) is torch's scaled_dot_product_attention with whatever
backend torch picks; these two pin it with torch.nn.attention.sdpa_kernel, so that a GPU
attention table shows cuDNN's and FlashAttention-2's times side by side (docs/attention.md
section 6, cases/attention-gpu.toml). Softmax attention, registered under
softmax_attention like `sdpa`, forward and backward (SDPA's own backward through autograd).

cuDNN runs on CUDA tensors only: on other devices the kernel refuses in one line rather
than let SDPA fall back to another backend under its name. The flash backend takes no
attn_mask on CUDA, so `sdpa_flash` declares none (a masked cell leaves it out and the
results' header says so); `sdpa_cudnn` takes one, as SDPA does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from elasticbench.harness.builtin.attention_family import autograd_step
from elasticbench.harness.builtin.torch_attention import _sdpa
from elasticbench.harness.kernel_spec import register_kernel


def _pinned(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            scale: float, causal: bool, attn_mask: torch.Tensor | None) -> torch.Tensor:
    """SDPA through this backend alone (RuntimeError where it cannot take the call)."""
    if backend == SDPBackend.CUDNN_ATTENTION and q.device.type != "cuda":
        raise RuntimeError(f"SDPA's cuDNN backend runs on CUDA tensors only, got "
                           f"{q.device.type} (ELASTICBENCH_TORCH_DEVICE=cuda)")
    with sdpa_kernel([backend]):
        return _sdpa(q, k, v, scale, causal, attn_mask)


def _with_grad(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float, causal: bool, attn_mask: torch.Tensor | None
               ) -> Callable[[torch.Tensor], Any]:
    """The forward with autograd, then step(dout) -> (dq, dk, dv) by SDPA's backward (run
    under the same backend)."""
    return autograd_step(lambda *t: _pinned(backend, *t, scale, causal, attn_mask), (q, k, v),
                         lambda: sdpa_kernel([backend]))


@register_kernel(function="softmax_attention", backend="torch", name="sdpa_cudnn",
                 baseline=True)
def sdpa_cudnn(q, k, v, *, scale, causal, attn_mask=None):
    """SDPA pinned to its cuDNN backend (CUDA only)."""
    return _pinned(SDPBackend.CUDNN_ATTENTION, q, k, v, scale, causal, attn_mask)


@register_kernel(function="softmax_attention", backend="torch", mode="bwd", name="sdpa_cudnn",
                 baseline=True)
def sdpa_cudnn_bwd(q, k, v, *, scale, causal, attn_mask=None):
    """SDPA's cuDNN forward with autograd, then its backward."""
    return _with_grad(SDPBackend.CUDNN_ATTENTION, q, k, v, scale, causal, attn_mask)


@register_kernel(function="softmax_attention", backend="torch", name="sdpa_flash",
                 baseline=True)
def sdpa_flash(q, k, v, *, scale, causal):
    """SDPA pinned to its flash backend (FlashAttention-2 on CUDA; torch's on the CPU)."""
    return _pinned(SDPBackend.FLASH_ATTENTION, q, k, v, scale, causal, None)


@register_kernel(function="softmax_attention", backend="torch", mode="bwd", name="sdpa_flash",
                 baseline=True)
def sdpa_flash_bwd(q, k, v, *, scale, causal):
    """SDPA's flash forward with autograd, then its backward."""
    return _with_grad(SDPBackend.FLASH_ATTENTION, q, k, v, scale, causal, None)
