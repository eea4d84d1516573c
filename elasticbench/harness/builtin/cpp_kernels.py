"""Native C++ kernels (backend `cpp`): the whole family forward, the exp family backward,
registered from the row functions' tables (elasticbench/harness/builtin/row_ops.py).

The sources are kernels/cpp (vectorized once per instruction set, picked at run time; rows
over torch's threads; few long rows split across threads in two phases); elasticbench.native
builds them through torch's extension API. docs/native.md describes the pass structures:

| kernel                  | sweeps over memory                                   | R | W | exps |
|-------------------------|------------------------------------------------------|---|---|------|
| cpp_elastic_three_pass  | max | sum exp | exp, scale                           | 3 | 1 | 2 |
| cpp_elastic_online      | block max + rescaled sum | exp, scale                | 2 | 1 | 2 |
| cpp_elastic (fused)     | block max + sum, exps stored in y | y rescaled by block | 2 | 2 | 1 |
| cpp_elastic_accurate    | online in fp64 (<= 1 ulp in fp32)                    | 2 | 1 | 2 (fp64) |

The fused kernel keeps its exps in y for fp64/fp32; a 16-bit y would round them, so for
fp16/bf16 they go to a per-thread fp32 row buffer. Special values follow docs/definitions.md
section 3.

Backward: fn(x, y, g, **params) -> dx (or dx, dtau, dbeta). Two sweeps: c = sum g y and max
y; then dx from y and g. Elastic's parameter gradients also need x in the first (the kept
max and the sums of y z' and g y z', in one read); dx alone reads x only for a row whose y
cannot tell its class (one-hot, tied or NaN: docs/native.md).
"""

from __future__ import annotations

from elasticbench.harness.builtin.row_ops import register_rows

register_rows("cpp", globals())
