"""The built-in kernels the harness judges, registered on import.

Each module `<backend>_<anything>.py` registers kernels of that backend with
`elasticbench.register_kernel`; the registry (elasticbench.harness.registry.BUILTINS) imports
those whose backend is available the first time kernels are listed. The library's own ops are
registered here like any other kernel; `attention_family.py` holds the attention family's
registration table (one row per function, which the backends' modules hand their
implementations to) and registers nothing itself.
"""
