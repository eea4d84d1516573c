"""Native fused attention (backend `cpp`): kernels/cpp/attention.cpp, one kernel templated on
the weight, forward and backward, under the attention contract (docs/attention.md section 4),
registered from the family's table (elasticbench/harness/builtin/attention_family.py) as `cpp_attention` for
elastic_attention and `cpp_<f>_attention` for softmax1, symax, stablemax and sigmoid
attention.

Flash-style tiles on the CPU: per (batch, head, query block) the key blocks are visited with
BLAS GEMMs and a running sum per query (an online max for the exp family); O(length) extra
memory. The backward recomputes the weights tile by tile from the forward's (m, den). Row
parameters arrive as (batch, heads) tensors (tau, beta, eta, bias); step(dout) returns (dq,
dk, dv) and then each row parameter's gradient. docs/native.md section 5.
"""

from __future__ import annotations

from elasticbench.attention import native_attention
from elasticbench.harness.builtin.attention_family import Implementation, register_family

CPP = Implementation("cpp", "cpp", "cpp", native_attention.forward, native_attention.backward)

register_family(CPP, globals())
