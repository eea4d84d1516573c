"""Differentiable Elastic-Softmax (and softmax, softmax1) with hand-written backward passes,
and attention with each weight of the family.

    y = elastic_softmax(x, tau, beta, dim=-1)
    out = elastic_attention(q, k, v, tau=..., beta=...)   # and softmax1_, symax_,
                                                          # stablemax_, sigmoid_attention

The attention functions share one path (operand checks, masks, the fused implementations
or the composite) and one special-value policy: docs/attention.md sections 1, 3 and 9.

The backward is docs/gradients.md section 2 evaluated in one pass over the saved output y
(and x, for the mask and the exponent arguments), never autograd through the composite;
elasticbench.rows.exp_normalize spells out the formulas. Each function is a torch custom op
(elasticbench.rows.ops); when autograd builds the gradient's graph (create_graph), the
gradient is the torch code's, so that second orders are exact (docs/gradients.md section 6).

Broadcasting of tau and beta: each is a Python float, a 0-d tensor, or a tensor that
broadcasts against x like an elementwise operand and has size 1 along `dim` (one value per
row at most), e.g. shape (H, 1, 1) for one value per head of scores (B, H, L, L). Their
gradients are summed over the rows they were broadcast to. Tensors are trusted to hold
tau > 0 and beta >= 0 (ElasticSoftmax guarantees it); floats are checked.

Special values: the forward follows docs/definitions.md section 3. Backward: masked positions get
exactly 0, fully masked rows and rows with +inf (whose output no finite change of the
input moves) give exactly zero gradients, and a NaN row gives a NaN row in dx and NaN
dtau and dbeta. fp16/bf16 compute and accumulate in fp32; fp64 and fp32 in their own
precision. Each call picks one implementation for its forward and backward
(elasticbench.rows.tiers): CPU tensors use the native C++ kernels, tau and beta scalar or per
row (elasticbench.native, docs/native.md), where they build, and CUDA tensors the Triton kernels
of elasticbench.kernels.triton when they import; everything else the torch code.
"""

from __future__ import annotations

import math

import torch

from .attention.weights import Weight
from .domains import BETA, BIAS, ETA, TAU, Domain
from .rows.layout import Scalar
from .rows.ops import along
from .rows.spec import ELASTIC, SOFTMAX, SOFTMAX1


def _check_param(domain: Domain, value: Scalar) -> Scalar:
    """A tensor parameter as given (trusted to hold values of the domain; ElasticSoftmax's
    and the family's modules guarantee it), a number checked against its domain."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(f"{domain.name} must be a float or a floating-point tensor")
        return value
    return domain.check(value)


def elastic_softmax(x: torch.Tensor, tau: Scalar = 1.0, beta: Scalar = 1.0, dim: int = -1):
    """Elastic-Softmax of x along dim, differentiable in x, tau and beta (see module doc)."""
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    tau, beta = _check_param(TAU, tau), _check_param(BETA, beta)
    return along(x, tau, beta, dim % max(x.ndim, 1), ELASTIC)


Causal = bool | str  # False, True (= "top_left"), "top_left" or "bottom_right"


def _attention(weight: Weight, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p0: Scalar,
               p1: Scalar, scale: float | None, causal: Causal,
               attn_mask: torch.Tensor | None, is_causal: Causal) -> torch.Tensor:
    """Every attention function's path: operands, scale and causal checked, then the fused
    implementations (no mask, or a bool key-padding mask) or the composite (any other), the
    causal alignment as one integer offset (layout.causal_offset)."""
    from .attention import composite
    from .attention.autograd import attention_op
    from .attention.layout import causal_offset, check_operands, default_scale, key_padding

    check_operands(q, k, v)
    if scale is None:
        scale = default_scale(q.shape[-1])
    elif not (isinstance(scale, int | float) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    lq, lk = q.shape[2], k.shape[2]
    diag = causal_offset(causal, lq, lk)
    spelled = causal_offset(is_causal, lq, lk)
    if diag is None:
        diag = spelled
    elif spelled is not None and spelled != diag:
        raise ValueError(f"causal={causal!r} and is_causal={is_causal!r} align the causal "
                         "mask differently: give one")
    on, offset = diag is not None, diag or 0
    key_mask = None if attn_mask is None else key_padding(attn_mask, q, k)
    if attn_mask is not None and key_mask is None:
        if weight is Weight.ELASTIC:
            return composite.elastic_attention_composite(
                q, k, v, tau=p0, beta=p1, scale=float(scale), causal=on, attn_mask=attn_mask,
                offset=offset)
        return composite.attention_composite(weight, q, k, v, p0=p0, p1=p1, scale=float(scale),
                                             causal=on, attn_mask=attn_mask, offset=offset)
    return attention_op(weight, q, k, v, p0, p1, float(scale), on, key_mask, offset)


_SHARED_DOC = """
    q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv) -> (B, H, Lq, Dv); scale defaults to
    1/sqrt(D); causal (or is_causal, SDPA's spelling): False, True or "top_left" hide key j
    from query i when j > i (top-left, as SDPA's is_causal), "bottom_right" when
    j > i + Lk - Lq (as FlashAttention, and a decode step's queries at the end of the cached
    keys); anything else is a ValueError. attn_mask, broadcastable to (B, H, Lq, Lk), as
    SDPA takes it: bool
    (True takes part) or float (added to the scores; -inf hides the key); a query left with
    no key gives zeros. Without a mask, or with a bool key-padding mask ((B, 1, 1, Lk)),
    the fused implementations run (O(length) memory, a tiled backward); any other mask
    materializes the scores. Special values: docs/attention.md sections 3 and 9.
"""


def elastic_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, tau: Scalar,
                      beta: Scalar, scale: float | None = None, causal: Causal = False,
                      attn_mask: torch.Tensor | None = None, is_causal: Causal = False
                      ) -> torch.Tensor:
    """Elastic-Softmax attention, as scaled_dot_product_attention with Elastic weights.

    q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv) -> (B, H, Lq, Dv); scale defaults to
    1/sqrt(D); causal (or is_causal, SDPA's spelling): False, True or "top_left" hide key j
    from query i when j > i (top-left, as SDPA's is_causal), "bottom_right" when
    j > i + Lk - Lq (as FlashAttention, and a decode step against a cache); anything else
    is a ValueError. tau and beta are floats, 0-d tensors or per-head tensors ((H,) or
    broadcasting against (B, H, 1, 1)). attn_mask, broadcastable to (B, H, Lq, Lk), as SDPA
    takes it: a bool mask (True takes part) or a float mask added to the scores before the
    negative scores are dropped; a query left with no key gives zeros. Differentiable in q,
    k, v, tau and beta; without a mask, or with a bool key-padding mask ((B, 1, 1, Lk)),
    a tiled backward recomputes the weights from two saved statistics per query
    (docs/attention.md); with any other mask, the scores are materialized.
    """
    tau, beta = _check_param(TAU, tau), _check_param(BETA, beta)
    return _attention(Weight.ELASTIC, q, k, v, tau, beta, scale, causal, attn_mask, is_causal)


def softmax1_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                       scale: float | None = None, causal: Causal = False,
                       attn_mask: torch.Tensor | None = None, is_causal: Causal = False
                       ) -> torch.Tensor:
    """Attention with softmax1 weights, exp(s_ij) / (1 + sum_j' exp(s_ij')): a query may
    give almost no weight to any key ("attention is off by one"). Differentiable in q, k, v.
    """
    return _attention(Weight.SOFTMAX1, q, k, v, 1.0, 1.0, scale, causal, attn_mask, is_causal)


def symax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, eta: Scalar = 1.0,
                    scale: float | None = None, causal: Causal = False,
                    attn_mask: torch.Tensor | None = None, is_causal: Causal = False
                    ) -> torch.Tensor:
    """Attention with symax weights, |s_ij| / (eta + sum_j' |s_ij'|), eta >= 0 (a float, a
    0-d or per-head tensor, or one broadcasting against (B, H, 1, 1)); differentiable in q,
    k, v and eta. With eta = 0 a query whose visible scores are all 0 gives zeros.
    """
    eta = _check_param(ETA, eta)
    return _attention(Weight.SYMAX, q, k, v, 0.0, eta, scale, causal, attn_mask, is_causal)


def stablemax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        scale: float | None = None, causal: Causal = False,
                        attn_mask: torch.Tensor | None = None, is_causal: Causal = False
                        ) -> torch.Tensor:
    """Attention with stablemax weights, st(s_ij) / sum_j' st(s_ij'), st(s) = s + 1 for
    s >= 0 and 1/(1 - s) below ("Grokking at the edge of numerical stability");
    differentiable in q, k, v.
    """
    return _attention(Weight.STABLEMAX, q, k, v, 0.0, 0.0, scale, causal, attn_mask,
                      is_causal)


def sigmoid_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      bias: Scalar | None = None, scale: float | None = None,
                      causal: Causal = False, attn_mask: torch.Tensor | None = None,
                      is_causal: Causal = False) -> torch.Tensor:
    """Attention with sigmoid weights, sigmoid(s_ij + bias) each, no normalizer (Apple's
    "Theory, Analysis, and Best Practices for Sigmoid Self-Attention"). bias None is
    -ln(Lk), Lk the number of keys (k.shape[2], masked ones included), as the paper sets
    it; else a float or a tensor as symax's eta. Differentiable in q, k, v and a tensor bias.
    """
    if bias is None:
        lk = k.shape[2] if isinstance(k, torch.Tensor) and k.ndim == 4 else 1
        bias = -math.log(lk) if lk > 0 else 0.0  # no key: nothing to weigh
    bias = _check_param(BIAS, bias)
    return _attention(Weight.SIGMOID, q, k, v, bias, 0.0, scale, causal, attn_mask, is_causal)


for _fn in (softmax1_attention, symax_attention, stablemax_attention, sigmoid_attention):
    _fn.__doc__ = (_fn.__doc__ or "").rstrip() + "\n" + _SHARED_DOC
del _fn


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Safe softmax along dim (all -inf rows give zeros) with a hand-written backward."""
    return along(x, SOFTMAX.tau, SOFTMAX.offset, dim % max(x.ndim, 1), SOFTMAX)


def softmax1(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x) / (1 + sum exp(x)) along dim, stable, with a hand-written backward."""
    return along(x, SOFTMAX1.tau, SOFTMAX1.offset, dim % max(x.ndim, 1), SOFTMAX1)


__all__ = ["elastic_attention", "elastic_softmax", "sigmoid_attention", "softmax",
           "softmax1", "softmax1_attention", "stablemax_attention", "symax_attention"]
