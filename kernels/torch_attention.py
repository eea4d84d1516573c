"""torch attention kernels: the eager composite, the tiled (flash) implementation, and SDPA.

Every kernel follows the attention contract (docs/attention.md section 4): the forward
returns out; the backward's first call runs the forward it needs and returns step(dout).
`torch_attention_flash` calls elasticbench.attention.flash directly (not the dispatcher of
elasticbench.functional, which may pick a native kernel), so it is the tiled torch code that
is verified and timed under its name. `sdpa` is torch's scaled_dot_product_attention, the
vendor baseline: softmax attention, so it is verified as softmax_attention. The composite
takes any attn_mask; the tiled code a (batch, length_k) key_mask (docs/attention.md section 4).
"""

from __future__ import annotations

import torch

from elasticbench.attention import flash
from elasticbench.attention.composite import elastic_attention_composite
from elasticbench.kernel_spec import register_kernel


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Detached copies that require grad: what autograd differentiates against."""
    return [t.detach().requires_grad_() for t in tensors]


def _autograd_step(out: torch.Tensor, leaves: list[torch.Tensor]):
    def step(dout: torch.Tensor):
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return step


def _per_head(p: torch.Tensor) -> torch.Tensor:
    return p[:, :, None, None]


@register_kernel(function="elastic_attention", backend="torch",
                 name="torch_attention_composite")
def torch_attention_composite(q, k, v, *, tau, beta, scale, causal, attn_mask=None):
    """The eager composite: the whole score matrix, elastic_softmax, weights @ v."""
    return elastic_attention_composite(q, k, v, tau=_per_head(tau), beta=_per_head(beta),
                                       scale=scale, causal=causal, attn_mask=attn_mask)


@register_kernel(function="elastic_attention", backend="torch", mode="bwd",
                 name="torch_attention_composite")
def torch_attention_composite_bwd(q, k, v, *, tau, beta, scale, causal, attn_mask=None):
    """The composite's gradients through autograd (Elastic-Softmax's own backward)."""
    leaves = _leaves(q, k, v, tau, beta)
    with torch.enable_grad():
        out = elastic_attention_composite(*leaves[:3], tau=_per_head(leaves[3]),
                                          beta=_per_head(leaves[4]), scale=scale,
                                          causal=causal, attn_mask=attn_mask)
    return _autograd_step(out, leaves)


@register_kernel(function="elastic_attention", backend="torch", name="torch_attention_flash")
def torch_attention_flash(q, k, v, *, tau, beta, scale, causal, key_mask=None):
    """Tiled torch: online max and sum over kept scores, O(length) extra memory."""
    return flash.forward(q, k, v, tau, beta, scale, causal, key_mask)


@register_kernel(function="elastic_attention", backend="torch", mode="bwd",
                 name="torch_attention_flash")
def torch_attention_flash_bwd(q, k, v, *, tau, beta, scale, causal, key_mask=None):
    """Tiled torch backward from the forward's two statistics per query."""
    out, m, den = flash.forward(q, k, v, tau, beta, scale, causal, key_mask)

    def step(dout: torch.Tensor):
        return flash.backward(q, k, v, out, dout, m, den, tau, beta, scale, causal, key_mask)
    return step


def _sdpa(q, k, v, scale, causal, attn_mask):
    """SDPA under attn_mask and causal at once (SDPA itself takes one or the other)."""
    if attn_mask is not None and causal:
        lq, lk = q.shape[2], k.shape[2]
        tril = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
        attn_mask = (attn_mask & tril if attn_mask.dtype == torch.bool
                     else attn_mask.masked_fill(~tril, -torch.inf))
        causal = False
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                            scale=scale, is_causal=causal)


@register_kernel(function="softmax_attention", backend="torch", name="sdpa", baseline=True)
def sdpa(q, k, v, *, scale, causal, attn_mask=None):
    """torch.nn.functional.scaled_dot_product_attention: softmax attention, the vendor."""
    return _sdpa(q, k, v, scale, causal, attn_mask)


@register_kernel(function="softmax_attention", backend="torch", mode="bwd", name="sdpa",
                 baseline=True)
def sdpa_bwd(q, k, v, *, scale, causal, attn_mask=None):
    """SDPA's forward with autograd, then its own backward."""
    leaves = _leaves(q, k, v)
    with torch.enable_grad():
        out = _sdpa(*leaves, scale, causal, attn_mask)
    return _autograd_step(out, leaves)
