"""Native fused attention (backend `cpp`): kernels/cpp/attention.cpp, one kernel templated on
the weight, forward and backward, under the attention contract (docs/attention.md section 4),
registered for elastic_attention and for softmax1, symax, stablemax and sigmoid attention.

Flash-style tiles on the CPU: per (batch, head, query block) the key blocks are visited with
BLAS GEMMs and a running sum per query (an online max for the exp family); O(length) extra
memory. The backward recomputes the weights tile by tile from the forward's (m, den). Row
parameters arrive as (batch, heads) tensors (eta, bias); step(dout) returns (dq, dk, dv) and
then each row parameter's gradient. docs/native.md section 5.
"""

from __future__ import annotations

import torch

from elasticbench.attention import cpp
from elasticbench.attention.weights import Weight
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


def _params(q: torch.Tensor, p0: torch.Tensor | None = None,
            p1: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(p0, p1) for the kernel: an absent one as zeros of the given one's shape (its weight
    ignores it), (batch, heads) zeros when neither is given."""
    given = p0 if p0 is not None else p1
    zero = torch.zeros(q.shape[:2]) if given is None else torch.zeros_like(given)
    return (zero if p0 is None else p0), (zero if p1 is None else p1)


def _forward(weight: Weight, q, k, v, scale, causal, key_mask, p0=None, p1=None):
    return cpp.forward(q, k, v, *_params(q, p0, p1), scale, causal, key_mask, weight)


def _step(weight: Weight, q, k, v, scale, causal, key_mask, p0=None, p1=None):
    """The forward now, then step(dout) -> (dq, dk, dv, *the given parameters' grads)."""
    a, b = _params(q, p0, p1)
    out, m, den = cpp.forward(q, k, v, a, b, scale, causal, key_mask, weight)

    def step(dout: torch.Tensor):
        dq, dk, dv, da, db = cpp.backward(q, k, v, out, dout, m, den, a, b, scale, causal,
                                          key_mask, weight)
        return (dq, dk, dv, *(g for g, p in ((da, p0), (db, p1)) if p is not None))
    return step


@register_kernel(function="softmax1_attention", backend="cpp", name="cpp_softmax1_attention")
def cpp_softmax1_attention(q, k, v, *, scale, causal, key_mask=None):
    """Fused forward: online max (floored at 0, the 1's exponent) and sum; (out, m, den)."""
    return _forward(Weight.SOFTMAX1, q, k, v, scale, causal, key_mask)


@register_kernel(function="softmax1_attention", backend="cpp", mode="bwd",
                 name="cpp_softmax1_attention")
def cpp_softmax1_attention_bwd(q, k, v, *, scale, causal, key_mask=None):
    """Fused forward (untimed), then step(dout): the backward from its two statistics."""
    return _step(Weight.SOFTMAX1, q, k, v, scale, causal, key_mask)


@register_kernel(function="symax_attention", backend="cpp", name="cpp_symax_attention")
def cpp_symax_attention(q, k, v, *, eta, scale, causal, key_mask=None):
    """Fused forward: running sums of |s| and |s| v, / (eta + sum) at the end."""
    return _forward(Weight.SYMAX, q, k, v, scale, causal, key_mask, p1=eta)


@register_kernel(function="symax_attention", backend="cpp", mode="bwd",
                 name="cpp_symax_attention")
def cpp_symax_attention_bwd(q, k, v, *, eta, scale, causal, key_mask=None):
    """Fused forward (untimed), then step(dout) -> (dq, dk, dv, deta)."""
    return _step(Weight.SYMAX, q, k, v, scale, causal, key_mask, p1=eta)


@register_kernel(function="stablemax_attention", backend="cpp", name="cpp_stablemax_attention")
def cpp_stablemax_attention(q, k, v, *, scale, causal, key_mask=None):
    """Fused forward: running sums of st(s) and st(s) v, normalized at the end."""
    return _forward(Weight.STABLEMAX, q, k, v, scale, causal, key_mask)


@register_kernel(function="stablemax_attention", backend="cpp", mode="bwd",
                 name="cpp_stablemax_attention")
def cpp_stablemax_attention_bwd(q, k, v, *, scale, causal, key_mask=None):
    """Fused forward (untimed), then step(dout): the backward from its denominators."""
    return _step(Weight.STABLEMAX, q, k, v, scale, causal, key_mask)


@register_kernel(function="sigmoid_attention", backend="cpp", name="cpp_sigmoid_attention")
def cpp_sigmoid_attention(q, k, v, *, bias, scale, causal, key_mask=None):
    """Fused forward: the sum of sigmoid(s + bias) v, no normalizer."""
    return _forward(Weight.SIGMOID, q, k, v, scale, causal, key_mask, p0=bias)


@register_kernel(function="sigmoid_attention", backend="cpp", mode="bwd",
                 name="cpp_sigmoid_attention")
def cpp_sigmoid_attention_bwd(q, k, v, *, bias, scale, causal, key_mask=None):
    """Fused forward (untimed), then step(dout) -> (dq, dk, dv, dbias)."""
    return _step(Weight.SIGMOID, q, k, v, scale, causal, key_mask, p0=bias)
