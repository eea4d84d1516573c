"""The Triton attention kernel, registered under the backend `triton` by the attention
contract (docs/attention.md section 4). Its code lives in elasticbench.kernels.triton.attention."""

from __future__ import annotations

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
