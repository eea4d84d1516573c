"""The exp family (Elastic-Softmax, softmax, softmax1) on rows-last tensors, below
`elasticbench.functional`, which holds only the autograd function and the public API.

- `layout`: tau and beta laid out against rows-last x, their gradients summed back, the
  working precision;
- `exp_normalize`: the computations in torch, forward and the one-pass backward (also the
  built-in torch kernels of kernels/torch_kernels.py, so the kernel verified is the code a
  model runs);
- `tiers`: the contract every implementation keeps (`ExpSpec`, `Tier`), the registry the
  tier modules add themselves to, and `choose`, which picks one tier per call: the native
  C++ kernels on CPU tensors (`cpp`), the Triton kernels on CUDA tensors
  (kernels/triton/tier.py), else the torch code.
"""
