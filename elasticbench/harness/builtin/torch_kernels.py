"""torch kernels for the whole family, registered from the row functions' tables
(elasticbench/harness/builtin/row_ops.py). Device-agnostic: the same code runs on CUDA tensors.

The exp-normalize members are elasticbench.rows.exp_normalize's forward and backward, the
torch tier of elasticbench.functional's autograd path, so the kernel verified here is the
code a model runs; stablemax and symax are torch code of the harness's (row_ops.TorchWeight).

fp64 and fp32 compute in their own precision; fp16 and bf16 compute and accumulate in
fp32 and round once at the end. Special values follow docs/definitions.md section 3.
Backward kernels: fn(x, y, g, **params) -> dx, or (dx, dtau, dbeta) for elastic.
"""

from __future__ import annotations

from elasticbench.harness.builtin.row_ops import register_rows

register_rows("torch", globals())
