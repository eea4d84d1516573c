"""The built-in Triton row kernels, registered under the backend `triton` from the row
functions' tables (elasticbench/harness/builtin/row_ops.py).

The kernels' code lives in `elasticbench.kernels.triton` (importing it registers nothing);
this module only names the wrappers to the registry. Each takes a 2-D (rows, n) fp32, fp16
or bf16 tensor and launches with the current `LaunchOptions` (docs/triton.md).
"""

from __future__ import annotations

from elasticbench.harness.builtin.row_ops import register_rows

register_rows("triton", globals())
