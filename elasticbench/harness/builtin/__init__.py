"""The built-in kernels the harness judges, registered on import.

Each module `<backend>_<anything>.py` registers kernels of that backend with
`elasticbench.register_kernel`; the registry (elasticbench.harness.registry.BUILTINS) imports
those whose backend is available the first time kernels are listed. The library's own ops are
registered here like any other kernel, from tables that register nothing themselves:
`row_ops.py` has one table per row function (elastic, softmax, softmax1, stablemax, symax),
each entry a kernel of the native, Triton, torch or API library, which `cpp_kernels.py`,
`triton_kernels.py`, `torch_kernels.py` and `api_kernels.py` register; `attention_family.py`
has one row per attention function, which the attention modules hand their implementations
to. The NumPy kernels (`numpy_kernels.py`) and torch's pass-structure variants
(`torch_variants.py`) are the harness's own.
"""
