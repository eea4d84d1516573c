"""Input buffers cycled between timed calls, so a kernel timed out of cache reads memory.

A kernel called again and again on one input finds it in the last-level cache when it fits
there, and is timed faster than it runs in a model, where each call reads fresh activations.
When the data a call must move exceeds half the cache, the call cycles through enough copies
of its inputs (together twice the cache) that each call's inputs were evicted since their
last use. `run`, `ab` and the pytest-benchmark suite time calls through this one helper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from elasticbench.harness.backends import get_backend
from elasticbench.harness.registry import KernelSpec


def rotation_count(footprint_bytes: int, arg_bytes: int, llc_bytes: int) -> int:
    """Copies of the inputs to cycle through: 1 in cache, else at least 2 and twice the LLC."""
    if footprint_bytes <= llc_bytes // 2:
        return 1
    return max(2, math.ceil(2 * llc_bytes / max(1, arg_bytes)))


@dataclass
class RotatingCall:
    """call(i) runs the kernel on copy i % copies of its inputs (the device's clock waits for
    it at the end of a timed span, so nothing here synchronizes)."""

    spec: KernelSpec
    natives: list[tuple[Any, ...]]
    params: dict[str, float]

    @property
    def copies(self) -> int:
        return len(self.natives)

    @property
    def out_of_cache(self) -> bool:
        return len(self.natives) > 1

    def __call__(self, i: int) -> None:
        self.spec.fn(*self.natives[i % len(self.natives)], **self.params)

    def release(self) -> None:
        """Drop the copies (before the next kernel allocates its own); no call after this."""
        self.natives.clear()


def rotating_call(spec: KernelSpec, args: Sequence[np.ndarray], params: dict[str, float],
                  footprint_bytes: int) -> RotatingCall:
    """The kernel's calls on enough copies of args, in its backend's array type, for the
    last-level cache of its backend's device."""
    backend = get_backend(spec.backend)
    copies = rotation_count(footprint_bytes, sum(a.nbytes for a in args), backend.llc_bytes())
    return RotatingCall(spec, [tuple(backend.to_native(a) for a in args)
                               for _ in range(copies)], params)

