"""Shared by slow5.py, slow10.py and slow25.py: the base kernel made slower by an exact factor.

The extra work is a busy loop that burns a fixed fraction of the CPU time the kernel itself
used in the same call (process CPU time, so every intra-op thread counts and time spent
descheduled by other processes does not). The slowdown is the stated factor of work on any
machine, and preemption stretches both versions alike.
"""

from __future__ import annotations

import time

from elasticbench.harness.builtin.torch_kernels import torch_elastic


def slowed(x, tau: float, beta: float, extra: float):
    c0 = time.process_time()
    y = torch_elastic(x, tau=tau, beta=beta)
    end = time.process_time() + extra * (time.process_time() - c0)
    while time.process_time() < end:
        pass
    return y
