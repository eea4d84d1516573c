"""Static audits: compile Triton kernels for an NVIDIA GPU without one and read back what the
compiler made of them (`compile`); model the built-in kernels on a GPU's datasheet (`model`,
`python -m elasticbench.harness.audit`)."""
