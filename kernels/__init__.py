"""Built-in kernels. Installed as `elasticbench.kernels`.

Each module `<backend>_<anything>.py` registers kernels of that backend with
`elasticbench.register_kernel` on import; the registry imports those whose backend is
available the first time kernels are listed. Kernel code too large for one module lives in a
package beside them (`triton/`), which registers nothing itself; `attention_family.py` holds
the attention family's registration table (one row per function, which the backends' modules
hand their implementations to) and registers nothing itself either.
"""
