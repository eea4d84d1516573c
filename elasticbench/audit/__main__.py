"""python -m elasticbench.audit: the static audit of the Triton kernels (docs/triton.md)."""

from .model import main

main()
