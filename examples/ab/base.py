"""A/B example, base version: Elastic-Softmax in torch, exactly the built-in torch_elastic.

The other files of this folder change this kernel in one way each, to measure the gate:

    elasticbench ab --kernel-file examples/ab/base.py --kernel-file examples/ab/slow25.py
"""

from __future__ import annotations

from elasticbench.harness.builtin.torch_kernels import torch_elastic
from elasticbench.harness.registry import register_kernel


@register_kernel(function="elastic", backend="torch", name="ab_elastic")
def ab_elastic(x, *, tau: float, beta: float):
    """Elastic-Softmax (the built-in torch kernel)."""
    return torch_elastic(x, tau=tau, beta=beta)
