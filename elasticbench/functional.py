"""Differentiable Elastic-Softmax (and softmax, softmax1) with hand-written backward passes,
and attention with each weight of the family.

    y = elastic_softmax(x, tau, beta, dim=-1)
    out = elastic_attention(q, k, v, tau=..., beta=...)   # and softmax1_, symax_,
                                                          # stablemax_, sigmoid_, cog_attention
    out = cog_attention(q, k, v, causal=True, gate=g)     # any of them, gated: out * g

The attention functions share one path (operand checks, masks, the gate, the fused
implementations or the composite) and one special-value policy: docs/attention.md sections
1, 3 and 9.

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

import functools
import math

import torch

from .attention.weights import Weight
from .domains import BETA, BIAS, ETA, TAU, Domain
from .rows.ops import along
from .rows.param_layout import Scalar
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


def _gate(gate: torch.Tensor | None, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """The gate as a (batch, heads, length_q, value_dim) view of the caller's tensor (autograd
    sums its gradient back over what was broadcast); one TypeError or ValueError for a gate
    that is not a tensor of q's dtype, on q's device, broadcasting to that shape."""
    if gate is None:
        return None
    if not isinstance(gate, torch.Tensor) or not gate.is_floating_point():
        raise TypeError(f"gate must be None or a floating-point tensor, got "
                        f"{getattr(gate, 'dtype', type(gate).__name__)}")
    if gate.dtype != q.dtype:
        raise TypeError(f"gate must have q's dtype {q.dtype}, got {gate.dtype}")
    if gate.device != q.device:
        raise ValueError(f"gate must be on q's device {q.device}, got {gate.device}")
    shape = (*q.shape[:3], v.shape[3])
    try:
        fits = torch.broadcast_shapes(gate.shape, shape) == shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"gate of shape {tuple(gate.shape)} does not broadcast to the "
                         f"output's (batch, heads, length_q, value_dim) = {shape}")
    return gate if gate.shape == shape else gate.expand(shape)


@functools.cache
def _attention_parts() -> tuple:
    """What _attention calls, imported at the first attention call (they register the custom
    ops, which `import elasticbench.functional` alone does not need) and then kept: an import
    statement per call is a fixed cost of every call."""
    from .attention import composite
    from .attention.autograd import attention_op
    from .attention.operands import causal_offset, check_operands, default_scale, key_padding

    return (composite, attention_op, causal_offset, check_operands, default_scale,
            key_padding)


def _attention(weight: Weight, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               p_score: Scalar, p_den: Scalar, scale: float | None, causal: Causal,
               attn_mask: torch.Tensor | None, is_causal: Causal,
               gate: torch.Tensor | None = None) -> torch.Tensor:
    """Every attention function's path: operands, scale, causal and the gate checked, then
    the fused implementations (no mask, or a bool key-padding mask; the gate in their
    epilogue) or the composite (any other; its output times the gate), the causal alignment
    as one integer offset (operands.causal_offset)."""
    composite, attention_op, causal_offset, check_operands, default_scale, key_padding = \
        _attention_parts()
    check_operands(q, k, v)
    gate = _gate(gate, q, v)
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
            out = composite.elastic_attention_composite(
                q, k, v, tau=p_score, beta=p_den, scale=float(scale), causal=on,
                attn_mask=attn_mask, offset=offset)
        else:
            out = composite.attention_composite(weight, q, k, v, p_score=p_score, p_den=p_den,
                                                scale=float(scale), causal=on,
                                                attn_mask=attn_mask, offset=offset)
        return out if gate is None else out * gate
    return attention_op(weight, q, k, v, p_score, p_den, float(scale), on, key_mask, offset,
                        gate)


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
    materializes the scores. Special values: docs/attention.md sections 3 and 9. gate: None
    or a tensor of q's dtype on q's device broadcasting to (B, H, Lq, Dv), the values of a
    gate already through its sigmoid: the output is attention(q, k, v) * gate, the product
    taken where the fused implementations normalize (no pass of its own), and the gate gets
    its gradient dY * attention(q, k, v) (docs/attention.md section 9).
"""


def elastic_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, tau: Scalar,
                      beta: Scalar, scale: float | None = None, causal: Causal = False,
                      attn_mask: torch.Tensor | None = None, is_causal: Causal = False,
                      gate: torch.Tensor | None = None) -> torch.Tensor:
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
    (docs/attention.md); with any other mask, the scores are materialized. gate: None or
    the values (after the sigmoid) of an output gate of q's dtype broadcasting to
    (B, H, Lq, Dv): the output is attention * gate, taken in the kernels' epilogue.
    """
    tau, beta = _check_param(TAU, tau), _check_param(BETA, beta)
    return _attention(Weight.ELASTIC, q, k, v, tau, beta, scale, causal, attn_mask, is_causal,
                      gate)


def softmax1_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                       scale: float | None = None, causal: Causal = False,
                       attn_mask: torch.Tensor | None = None, is_causal: Causal = False,
                       gate: torch.Tensor | None = None) -> torch.Tensor:
    """Attention with softmax1 weights, exp(s_ij) / (1 + sum_j' exp(s_ij')): a query may
    give almost no weight to any key ("attention is off by one"). Differentiable in q, k, v.
    """
    return _attention(Weight.SOFTMAX1, q, k, v, 1.0, 1.0, scale, causal, attn_mask, is_causal,
                      gate)


def symax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, eta: Scalar = 1.0,
                    scale: float | None = None, causal: Causal = False,
                    attn_mask: torch.Tensor | None = None, is_causal: Causal = False,
                    gate: torch.Tensor | None = None) -> torch.Tensor:
    """Attention with symax weights, |s_ij| / (eta + sum_j' |s_ij'|), eta >= 0 (a float, a
    0-d or per-head tensor, or one broadcasting against (B, H, 1, 1)); differentiable in q,
    k, v and eta. With eta = 0 a query whose visible scores are all 0 gives zeros.
    """
    eta = _check_param(ETA, eta)
    return _attention(Weight.SYMAX, q, k, v, 0.0, eta, scale, causal, attn_mask, is_causal,
                      gate)


def stablemax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        scale: float | None = None, causal: Causal = False,
                        attn_mask: torch.Tensor | None = None, is_causal: Causal = False,
                        gate: torch.Tensor | None = None) -> torch.Tensor:
    """Attention with stablemax weights, st(s_ij) / sum_j' st(s_ij'), st(s) = s + 1 for
    s >= 0 and 1/(1 - s) below ("Grokking at the edge of numerical stability");
    differentiable in q, k, v.
    """
    return _attention(Weight.STABLEMAX, q, k, v, 0.0, 0.0, scale, causal, attn_mask,
                      is_causal, gate)


def sigmoid_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      bias: Scalar | None = None, scale: float | None = None,
                      causal: Causal = False, attn_mask: torch.Tensor | None = None,
                      is_causal: Causal = False, gate: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """Attention with sigmoid weights, sigmoid(s_ij + bias) each, no normalizer (Apple's
    "Theory, Analysis, and Best Practices for Sigmoid Self-Attention"). bias None is
    -ln(Lk), Lk the number of keys (k.shape[2], masked ones included), as the paper sets
    it; else a float or a tensor as symax's eta. Differentiable in q, k, v and a tensor bias.
    """
    if bias is None:
        lk = k.shape[2] if isinstance(k, torch.Tensor) and k.ndim == 4 else 1
        bias = -math.log(lk) if lk > 0 else 0.0  # no key: nothing to weigh
    bias = _check_param(BIAS, bias)
    return _attention(Weight.SIGMOID, q, k, v, bias, 0.0, scale, causal, attn_mask, is_causal,
                      gate)


def cog_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  scale: float | None = None, causal: Causal = False,
                  attn_mask: torch.Tensor | None = None, is_causal: Causal = False,
                  gate: torch.Tensor | None = None) -> torch.Tensor:
    """Cog attention (signed weights, "More Expressive Attention with Negative Weights", Lv
    et al.): w_ij = sign(s_ij) exp(|s_ij|) / sum_j' exp(|s_ij'|) over the visible keys, so
    the weights lie in (-1, 1) and their absolute values sum to 1; a zero score has weight
    0 (but counts in the denominator), scores of infinite |s| share the query's weight as
    sign(s)/k. No parameter; differentiable in q, k, v.
    """
    return _attention(Weight.COG, q, k, v, 0.0, 0.0, scale, causal, attn_mask, is_causal,
                      gate)


for _fn in (softmax1_attention, symax_attention, stablemax_attention, sigmoid_attention,
            cog_attention):
    _fn.__doc__ = (_fn.__doc__ or "").rstrip() + "\n" + _SHARED_DOC
del _fn


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Safe softmax along dim (all -inf rows give zeros) with a hand-written backward."""
    return along(x, SOFTMAX.tau, SOFTMAX.offset, dim % max(x.ndim, 1), SOFTMAX)


def softmax1(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x) / (1 + sum exp(x)) along dim, stable, with a hand-written backward."""
    return along(x, SOFTMAX1.tau, SOFTMAX1.offset, dim % max(x.ndim, 1), SOFTMAX1)


__all__ = ["cog_attention", "elastic_attention", "elastic_softmax", "sigmoid_attention",
           "softmax", "softmax1", "softmax1_attention", "stablemax_attention",
           "symax_attention"]
