"""A/B example: the base kernel made 25% slower (same output, a calibrated busy wait)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from elasticbench.harness.registry import register_kernel

_spec = importlib.util.spec_from_file_location("_ab_slow", Path(__file__).with_name("_slow.py"))
_slow = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_slow)


@register_kernel(function="elastic", backend="torch", name="ab_elastic")
def ab_elastic(x, *, tau: float, beta: float):
    """Elastic-Softmax, 25% slower than the base version."""
    return _slow.slowed(x, tau, beta, extra=0.25)
