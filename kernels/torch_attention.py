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
from elasticbench.attention.composite import attention_composite, elastic_attention_composite
from elasticbench.attention.weights import Weight
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


# The family's composites (attention/composite.py attention_composite): one per attention
# function of docs/attention.md section 9, every row parameter a (batch, heads) tensor.


def _family(weight, q, k, v, scale, causal, attn_mask, p0=None, p1=None):
    zero = 0.0
    return attention_composite(weight, q, k, v, p0=zero if p0 is None else _per_head(p0),
                               p1=zero if p1 is None else _per_head(p1), scale=scale,
                               causal=causal, attn_mask=attn_mask)


def _family_bwd(weight, q, k, v, scale, causal, attn_mask, **params):
    """The composite's gradients through autograd: (dq, dk, dv, *dparams)."""
    names = list(params)
    leaves = _leaves(q, k, v, *params.values())
    with torch.enable_grad():
        out = _family(weight, *leaves[:3], scale, causal, attn_mask,
                      **dict(zip(names, leaves[3:], strict=True)))
    return _autograd_step(out, leaves)


@register_kernel(function="softmax1_attention", backend="torch",
                 name="torch_softmax1_attention_composite")
def torch_softmax1_attention_composite(q, k, v, *, scale, causal, attn_mask=None):
    """The eager composite: the whole score matrix, softmax1, weights @ v."""
    return _family(Weight.SOFTMAX1, q, k, v, scale, causal, attn_mask)


@register_kernel(function="softmax1_attention", backend="torch", mode="bwd",
                 name="torch_softmax1_attention_composite")
def torch_softmax1_attention_composite_bwd(q, k, v, *, scale, causal, attn_mask=None):
    """The composite's gradients through autograd."""
    return _family_bwd(Weight.SOFTMAX1, q, k, v, scale, causal, attn_mask)


@register_kernel(function="symax_attention", backend="torch",
                 name="torch_symax_attention_composite")
def torch_symax_attention_composite(q, k, v, *, eta, scale, causal, attn_mask=None):
    """The eager composite: the whole score matrix, |s| / (eta + sum |s|), weights @ v."""
    return _family(Weight.SYMAX, q, k, v, scale, causal, attn_mask, p1=eta)


@register_kernel(function="symax_attention", backend="torch", mode="bwd",
                 name="torch_symax_attention_composite")
def torch_symax_attention_composite_bwd(q, k, v, *, eta, scale, causal, attn_mask=None):
    """The composite's gradients through autograd (deta included)."""
    return _family_bwd(Weight.SYMAX, q, k, v, scale, causal, attn_mask, p1=eta)


@register_kernel(function="stablemax_attention", backend="torch",
                 name="torch_stablemax_attention_composite")
def torch_stablemax_attention_composite(q, k, v, *, scale, causal, attn_mask=None):
    """The eager composite: the whole score matrix, stablemax, weights @ v."""
    return _family(Weight.STABLEMAX, q, k, v, scale, causal, attn_mask)


@register_kernel(function="stablemax_attention", backend="torch", mode="bwd",
                 name="torch_stablemax_attention_composite")
def torch_stablemax_attention_composite_bwd(q, k, v, *, scale, causal, attn_mask=None):
    """The composite's gradients through autograd."""
    return _family_bwd(Weight.STABLEMAX, q, k, v, scale, causal, attn_mask)


@register_kernel(function="sigmoid_attention", backend="torch",
                 name="torch_sigmoid_attention_composite")
def torch_sigmoid_attention_composite(q, k, v, *, bias, scale, causal, attn_mask=None):
    """The eager composite: the whole score matrix, sigmoid(s + bias), weights @ v."""
    return _family(Weight.SIGMOID, q, k, v, scale, causal, attn_mask, p0=bias)


@register_kernel(function="sigmoid_attention", backend="torch", mode="bwd",
                 name="torch_sigmoid_attention_composite")
def torch_sigmoid_attention_composite_bwd(q, k, v, *, bias, scale, causal, attn_mask=None):
    """The composite's gradients through autograd (dbias included)."""
    return _family_bwd(Weight.SIGMOID, q, k, v, scale, causal, attn_mask, p0=bias)


# The family's tiled torch code (attention/flash.py, one forward and backward for every
# weight), called directly as torch_attention_flash is: the tiled code verified and timed
# under its name. Row parameters arrive as (batch, heads) tensors; step(dout) returns
# (dq, dk, dv) and then each row parameter's gradient (deta, dbias).


def _flash_params(q: torch.Tensor, p0: torch.Tensor | None = None,
                  p1: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(p0, p1) for flash: an absent one as zeros (its weight ignores it)."""
    given = p0 if p0 is not None else p1
    zero = (torch.zeros(q.shape[:2], dtype=torch.float64 if q.dtype == torch.float64
                        else torch.float32, device=q.device) if given is None
            else torch.zeros_like(given))
    return (zero if p0 is None else p0), (zero if p1 is None else p1)


def _flash_step(weight: Weight, q, k, v, scale, causal, key_mask, p0=None, p1=None):
    """The forward now, then step(dout) -> (dq, dk, dv, *the given parameters' grads)."""
    a, b = _flash_params(q, p0, p1)
    out, m, den = flash.forward(q, k, v, a, b, scale, causal, key_mask, weight)

    def step(dout: torch.Tensor):
        dq, dk, dv, da, db = flash.backward(q, k, v, out, dout, m, den, a, b, scale, causal,
                                            key_mask, weight)
        return (dq, dk, dv, *(g for g, p in ((da, p0), (db, p1)) if p is not None))
    return step


@register_kernel(function="softmax1_attention", backend="torch",
                 name="torch_softmax1_attention_flash")
def torch_softmax1_attention_flash(q, k, v, *, scale, causal, key_mask=None):
    """Tiled torch: online max (floored at 0) and sum, the 1 rescaled, O(length) memory."""
    return flash.forward(q, k, v, *_flash_params(q), scale, causal, key_mask,
                         Weight.SOFTMAX1)


@register_kernel(function="softmax1_attention", backend="torch", mode="bwd",
                 name="torch_softmax1_attention_flash")
def torch_softmax1_attention_flash_bwd(q, k, v, *, scale, causal, key_mask=None):
    """Tiled torch backward from the forward's two statistics per query."""
    return _flash_step(Weight.SOFTMAX1, q, k, v, scale, causal, key_mask)


@register_kernel(function="symax_attention", backend="torch", name="torch_symax_attention_flash")
def torch_symax_attention_flash(q, k, v, *, eta, scale, causal, key_mask=None):
    """Tiled torch: plain running sums of |s| and |s| v, / (eta + sum) at the end."""
    return flash.forward(q, k, v, *_flash_params(q, p1=eta), scale, causal, key_mask,
                         Weight.SYMAX)


@register_kernel(function="symax_attention", backend="torch", mode="bwd",
                 name="torch_symax_attention_flash")
def torch_symax_attention_flash_bwd(q, k, v, *, eta, scale, causal, key_mask=None):
    """Tiled torch backward (deta = -sum_i rowsum(dO out)_i / den_i)."""
    return _flash_step(Weight.SYMAX, q, k, v, scale, causal, key_mask, p1=eta)


@register_kernel(function="stablemax_attention", backend="torch",
                 name="torch_stablemax_attention_flash")
def torch_stablemax_attention_flash(q, k, v, *, scale, causal, key_mask=None):
    """Tiled torch: plain running sums of st(s) and st(s) v, normalized at the end."""
    return flash.forward(q, k, v, *_flash_params(q), scale, causal, key_mask,
                         Weight.STABLEMAX)


@register_kernel(function="stablemax_attention", backend="torch", mode="bwd",
                 name="torch_stablemax_attention_flash")
def torch_stablemax_attention_flash_bwd(q, k, v, *, scale, causal, key_mask=None):
    """Tiled torch backward from the forward's denominators."""
    return _flash_step(Weight.STABLEMAX, q, k, v, scale, causal, key_mask)


@register_kernel(function="sigmoid_attention", backend="torch",
                 name="torch_sigmoid_attention_flash")
def torch_sigmoid_attention_flash(q, k, v, *, bias, scale, causal, key_mask=None):
    """Tiled torch: sum of sigmoid(s + bias) v, no normalizer."""
    return flash.forward(q, k, v, *_flash_params(q, p0=bias), scale, causal, key_mask,
                         Weight.SIGMOID)


@register_kernel(function="sigmoid_attention", backend="torch", mode="bwd",
                 name="torch_sigmoid_attention_flash")
def torch_sigmoid_attention_flash_bwd(q, k, v, *, bias, scale, causal, key_mask=None):
    """Tiled torch backward (ds = g y (1 - y), dbias = sum ds)."""
    return _flash_step(Weight.SIGMOID, q, k, v, scale, causal, key_mask, p0=bias)
