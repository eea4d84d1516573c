"""Native fused Elastic attention (backend `cpp`): kernels/cpp/attention.cpp, forward and
backward, under the attention contract (docs/attention.md section 4).

Flash-style tiles on the CPU: per (batch, head, query block) the key blocks are visited with
BLAS GEMMs and an online kept max and sum per query; O(length) extra memory. The backward
recomputes the weights tile by tile from the forward's (m, den). docs/native.md section 5.
"""

from __future__ import annotations

import torch

from elasticbench.attention import cpp
from elasticbench.kernel_spec import register_kernel


@register_kernel(function="elastic_attention", backend="cpp", name="cpp_attention")
def cpp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, tau: torch.Tensor,
                  beta: torch.Tensor, scale: float, causal: bool,
                  key_mask: torch.Tensor | None = None):
    """Fused forward: (out, m, den), out in q's dtype; key_mask hides padded keys."""
    return cpp.forward(q, k, v, tau, beta, scale, causal, key_mask)


@register_kernel(function="elastic_attention", backend="cpp", mode="bwd", name="cpp_attention")
def cpp_attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, tau: torch.Tensor,
                      beta: torch.Tensor, scale: float, causal: bool,
                      key_mask: torch.Tensor | None = None):
    """Fused forward (untimed), then step(dout): the backward from its two statistics."""
    out, m, den = cpp.forward(q, k, v, tau, beta, scale, causal, key_mask)

    def step(dout: torch.Tensor):
        return cpp.backward(q, k, v, out, dout, m, den, tau, beta, scale, causal, key_mask)
    return step
