"""The Triton attention kernel, registered under the backend `triton` by the attention
contract (docs/attention.md section 4), for elastic_attention and for softmax1, symax,
stablemax and sigmoid attention (one kernel, the weight a compile-time choice). Row
parameters arrive as (batch, heads) tensors (eta, bias); a bwd step(dout) returns (dq, dk,
dv) and then each row parameter's gradient. Its code lives in
elasticbench.kernels.triton.attention."""

from __future__ import annotations

import torch

from elasticbench.attention.weights import Weight
from elasticbench.kernel_spec import register_kernel

from .triton.attention import attention_backward, attention_forward
from .triton.launch import DTYPES


@register_kernel(function="elastic_attention", backend="triton", dtypes=DTYPES,
                 name="triton_attention")
def triton_attention(q, k, v, *, tau, beta, scale, causal, key_mask=None):
    """Elastic attention in Triton: flash tiles, online max and sum over kept scores."""
    return attention_forward(q, k, v, tau, beta, scale, causal, key_mask)


@register_kernel(function="elastic_attention", backend="triton", dtypes=DTYPES, mode="bwd",
                 name="triton_attention")
def triton_attention_bwd(q, k, v, *, tau, beta, scale, causal, key_mask=None):
    """Triton backward from the forward's statistics: dk, dv per key block, dq per query block."""
    out, m, den = attention_forward(q, k, v, tau, beta, scale, causal, key_mask)
    return lambda dout: attention_backward(q, k, v, out, dout, m, den, tau, beta, scale, causal,
                                           key_mask)


def _params(q, p0=None, p1=None):
    """(p0, p1) for the kernel: an absent one as zeros of the given one's shape (its weight
    ignores it), (batch, heads) zeros when neither is given."""
    given = p0 if p0 is not None else p1
    zero = (torch.zeros(q.shape[:2], device=q.device) if given is None
            else torch.zeros_like(given))
    return (zero if p0 is None else p0), (zero if p1 is None else p1)


def _forward(weight: Weight, q, k, v, scale, causal, key_mask, p0=None, p1=None):
    return attention_forward(q, k, v, *_params(q, p0, p1), scale, causal, key_mask, weight)


def _step(weight: Weight, q, k, v, scale, causal, key_mask, p0=None, p1=None):
    """The forward now, then step(dout) -> (dq, dk, dv, *the given parameters' grads)."""
    a, b = _params(q, p0, p1)
    out, m, den = attention_forward(q, k, v, a, b, scale, causal, key_mask, weight)

    def step(dout: torch.Tensor):
        dq, dk, dv, da, db = attention_backward(q, k, v, out, dout, m, den, a, b, scale, causal,
                                                key_mask, weight)
        return (dq, dk, dv, *(g for g, p in ((da, p0), (db, p1)) if p is not None))
    return step


@register_kernel(function="softmax1_attention", backend="triton", dtypes=DTYPES,
                 name="triton_softmax1_attention")
def triton_softmax1_attention(q, k, v, *, scale, causal, key_mask=None):
    """softmax1 in Triton: Elastic's tiles at tau = 1, beta = 1, keeping every score."""
    return _forward(Weight.SOFTMAX1, q, k, v, scale, causal, key_mask)


@register_kernel(function="softmax1_attention", backend="triton", dtypes=DTYPES, mode="bwd",
                 name="triton_softmax1_attention")
def triton_softmax1_attention_bwd(q, k, v, *, scale, causal, key_mask=None):
    """Forward (untimed), then step(dout) -> (dq, dk, dv)."""
    return _step(Weight.SOFTMAX1, q, k, v, scale, causal, key_mask)


@register_kernel(function="symax_attention", backend="triton", dtypes=DTYPES,
                 name="triton_symax_attention")
def triton_symax_attention(q, k, v, *, eta, scale, causal, key_mask=None):
    """symax in Triton: running sums of |s| and |s| v, / (eta + sum) at the end."""
    return _forward(Weight.SYMAX, q, k, v, scale, causal, key_mask, p1=eta)


@register_kernel(function="symax_attention", backend="triton", dtypes=DTYPES, mode="bwd",
                 name="triton_symax_attention")
def triton_symax_attention_bwd(q, k, v, *, eta, scale, causal, key_mask=None):
    """Forward (untimed), then step(dout) -> (dq, dk, dv, deta)."""
    return _step(Weight.SYMAX, q, k, v, scale, causal, key_mask, p1=eta)


@register_kernel(function="stablemax_attention", backend="triton", dtypes=DTYPES,
                 name="triton_stablemax_attention")
def triton_stablemax_attention(q, k, v, *, scale, causal, key_mask=None):
    """stablemax in Triton: running sums of st(s) and st(s) v, normalized at the end."""
    return _forward(Weight.STABLEMAX, q, k, v, scale, causal, key_mask)


@register_kernel(function="stablemax_attention", backend="triton", dtypes=DTYPES, mode="bwd",
                 name="triton_stablemax_attention")
def triton_stablemax_attention_bwd(q, k, v, *, scale, causal, key_mask=None):
    """Forward (untimed), then step(dout) -> (dq, dk, dv)."""
    return _step(Weight.STABLEMAX, q, k, v, scale, causal, key_mask)


@register_kernel(function="sigmoid_attention", backend="triton", dtypes=DTYPES,
                 name="triton_sigmoid_attention")
def triton_sigmoid_attention(q, k, v, *, bias, scale, causal, key_mask=None):
    """sigmoid attention in Triton: the sum of sigmoid(s + bias) v, no normalizer."""
    return _forward(Weight.SIGMOID, q, k, v, scale, causal, key_mask, p0=bias)


@register_kernel(function="sigmoid_attention", backend="triton", dtypes=DTYPES, mode="bwd",
                 name="triton_sigmoid_attention")
def triton_sigmoid_attention_bwd(q, k, v, *, bias, scale, causal, key_mask=None):
    """Forward (untimed), then step(dout) -> (dq, dk, dv, dbias)."""
    return _step(Weight.SIGMOID, q, k, v, scale, causal, key_mask, p0=bias)
