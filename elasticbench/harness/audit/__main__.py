"""python -m elasticbench.harness.audit: the static audit of the Triton kernels (docs/triton.md)."""

from elasticbench.harness.audit.model import main

main()
