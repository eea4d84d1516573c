"""The library's kernels, installed as `elasticbench.kernels`: the Triton kernels
(`triton/`, with their autograd tier) and the native C++ sources (`cpp/`, built by
elasticbench.native). The harness's registrations of built-in kernels live in
elasticbench.harness.builtin.
"""
