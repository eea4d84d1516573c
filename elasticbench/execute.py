"""Calling a kernel safely: fresh input, exceptions captured, input and aliasing watched.

Shared by verification and timing, so both see kernels the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .backends import get_backend
from .registry import KernelSpec


@dataclass
class Outcome:
    """What one call of a kernel did."""

    output: np.ndarray | None  # the result as NumPy, None when the call failed
    error: str | None  # exception or contract violation, one line
    modified_input: bool
    returned_input: bool
    seconds: float


def call_kernel(spec: KernelSpec, x: np.ndarray, params: dict[str, float]) -> Outcome:
    """Run spec on a fresh copy of x in its backend's array type and bring the result back."""
    backend = get_backend(spec.backend)
    native = backend.to_native(x)
    start = time.perf_counter()
    try:
        out = spec.fn(native, **params)
        backend.synchronize()
    except Exception as e:  # a kernel's failure is a result, not a crash of the run
        return Outcome(None, f"raised {type(e).__name__}: {e}".splitlines()[0], False, False,
                       time.perf_counter() - start)
    seconds = time.perf_counter() - start
    returned_input = backend.same_memory(out, native)
    after = backend.to_numpy(native)
    modified = not np.array_equal(after.view(np.uint8), x.view(np.uint8))
    try:
        result = np.array(backend.to_numpy(out), copy=True)
    except TypeError as e:
        return Outcome(None, f"returned the wrong type: {e}", modified, returned_input, seconds)
    return Outcome(result, None, modified, returned_input, seconds)
