"""torch attention kernels: the eager composite, the tiled (flash) implementation, and SDPA.

Every kernel follows the attention contract (docs/attention.md section 4): the forward
returns out; the backward's first call runs the forward it needs and returns step(dout).
The composite and the tiled code each compute the whole family (elastic, softmax1, symax,
stablemax, sigmoid attention): their kernels, `torch_attention_composite`,
`torch_<f>_attention_composite`, `torch_attention_flash` and `torch_<f>_attention_flash`, are
registered from the family's table (elasticbench/harness/builtin/attention_family.py). The composite takes any
attn_mask and gets its gradients from autograd; the tiled code takes a (batch, length_k)
key_mask. `*_flash` calls elasticbench.attention.flash directly (not the dispatcher of
elasticbench.functional, which may pick a native kernel), so it is the tiled torch code
that is verified and timed under its name. `sdpa` is torch's scaled_dot_product_attention,
the vendor baseline: softmax attention, so it is verified as softmax_attention.
"""

from __future__ import annotations

import torch

from elasticbench.attention import flash
from elasticbench.attention.composite import attention_composite, elastic_attention_composite
from elasticbench.attention.weights import Weight
from elasticbench.harness.builtin.attention_family import (
    FUNCTIONS,
    Implementation,
    autograd_step,
    register_family,
)
from elasticbench.harness.kernel_spec import register_kernel


def _per_head(p: torch.Tensor) -> torch.Tensor:
    return p[:, :, None, None]


def _composite(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               p_score: torch.Tensor | None, p_den: torch.Tensor | None, scale: float,
               causal: bool, attn_mask: torch.Tensor | None, weight: Weight) -> torch.Tensor:
    """The eager composite of `weight` (attention/composite.py): the whole score matrix, the
    weights, weights @ v; p_score, p_den (batch, heads) tensors, None where the weight has
    none."""
    if weight is Weight.ELASTIC:
        return elastic_attention_composite(q, k, v, tau=_per_head(p_score),
                                           beta=_per_head(p_den), scale=scale, causal=causal,
                                           attn_mask=attn_mask)
    return attention_composite(weight, q, k, v,
                               p_score=0.0 if p_score is None else _per_head(p_score),
                               p_den=0.0 if p_den is None else _per_head(p_den), scale=scale,
                               causal=causal, attn_mask=attn_mask)


COMPOSITE = Implementation("composite", "torch", "torch", _composite, suffix="_composite",
                           mask="attn_mask")
FLASH = Implementation("flash", "torch", "torch", flash.forward, flash.backward,
                       suffix="_flash")


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


# Registration order is the registry's, which `elasticbench list` and verify's tables show:
# Elastic's two torch kernels, SDPA, then the rest of the family's composites and tiled code.
register_family(COMPOSITE, globals(), ["elastic_attention"])
register_family(FLASH, globals(), ["elastic_attention"])


@register_kernel(function="softmax_attention", backend="torch", name="sdpa", baseline=True)
def sdpa(q, k, v, *, scale, causal, attn_mask=None):
    """torch.nn.functional.scaled_dot_product_attention: softmax attention, the vendor."""
    return _sdpa(q, k, v, scale, causal, attn_mask)


@register_kernel(function="softmax_attention", backend="torch", mode="bwd", name="sdpa",
                 baseline=True)
def sdpa_bwd(q, k, v, *, scale, causal, attn_mask=None):
    """SDPA's forward with autograd, then its own backward."""
    return autograd_step(lambda *t: _sdpa(*t, scale, causal, attn_mask), (q, k, v))


_REST = [f for f in FUNCTIONS if f != "elastic_attention"]
register_family(COMPOSITE, globals(), _REST)
register_family(FLASH, globals(), _REST)
