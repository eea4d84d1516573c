"""The exp family (Elastic-Softmax, softmax, softmax1) on rows-last tensors, below
`elasticbench.functional`, which holds only the autograd function and the public API.

- `param_layout`: tau and beta laid out against rows-last x, their gradients summed back, the
  working precision;
- `exp_normalize`: the computations in torch, forward and the one-pass backward (also the
  built-in torch kernels of elasticbench/harness/builtin/row_ops.py, so the kernel verified is the code a
  model runs);
- `spec`: what a row computes (`ExpSpec`) and the contract every implementation keeps;
- `native_rows`: the native C++ implementation;
- `tiers`: the torch implementation and `choose`, which picks one per call by
  elasticbench.dispatch's preference: the native C++ kernels on CPU tensors, the Triton
  kernels (kernels/triton/tier.py) on CUDA tensors, else the torch code;
- `ops`: the custom ops and the autograd function behind elasticbench.functional.
"""
