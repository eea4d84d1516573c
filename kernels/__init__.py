"""Built-in kernels, one module per backend. Installed as `elasticbench.kernels`.

Each module registers its kernels with `elasticbench.register_kernel` on import; the
registry imports them the first time kernels are listed.
"""
