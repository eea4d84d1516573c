"""The Triton kernels' code, one module per concern; registering them is the harness's (`elasticbench/harness/builtin/row_ops.py`).

- `launch`: LaunchOptions (the launcher's arguments), row paths, grid and occupancy;
- `memory`: fp32 loads and stores, and the NaN-propagating maximum (vectorized for the
  interpreter);
- `row_parts`: pieces every row kernel shares (special rows, the quotient's rounding);
- `exp_family`: elastic, softmax and softmax1 forward, and the exponential they share;
- `weight_family`: stablemax and symax forward;
- `elastic_backward`: the Elastic-Softmax backward;
- `params`: where a row kernel reads tau and beta (scalars, per row, or device memory);
- `flash_attention`: the family's fused attention, forward and backward (FlashAttention-2
  structure), and `attention_configs`: its tile lists and how one is chosen;
- `tier`: the tier of elasticbench.functional's autograd path on CUDA tensors, which it
  registers with elasticbench.rows.tiers on import.

Importing these registers no kernel; docs/triton.md describes the design. A new kernel (or
family) goes into a module of its own here, and its registration into a module of the
kernels package named `triton_<anything>`.
"""
