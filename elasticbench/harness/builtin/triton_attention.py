"""The Triton attention kernel, registered under the backend `triton` by the attention
contract (docs/attention.md section 4) from the family's table (elasticbench/harness/builtin/attention_family.py):
`triton_attention` for elastic_attention and `triton_<f>_attention` for softmax1, symax,
stablemax and sigmoid attention (one kernel, the weight a compile-time choice). Row
parameters arrive as (batch, heads) tensors (tau, beta, eta, bias); a bwd step(dout) returns
(dq, dk, dv) and then each row parameter's gradient. Its code lives in
elasticbench.kernels.triton.flash_attention."""

from __future__ import annotations

from elasticbench.harness.builtin.attention_family import Implementation, register_family
from elasticbench.kernels.triton.flash_attention import attention_backward, attention_forward
from elasticbench.kernels.triton.launch import DTYPES

TRITON = Implementation("triton", "triton", "triton", attention_forward, attention_backward,
                        dtypes=DTYPES)

register_family(TRITON, globals())
