"""Calling a kernel safely: fresh input, exceptions captured, input and aliasing watched.

Shared by verification and timing, so both see kernels the same way.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import signal
import sys
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


def _child(spec: KernelSpec, x: np.ndarray, params: dict[str, float], conn) -> None:
    faulthandler.disable()  # a crash is reported by the parent, in one line
    try:
        conn.send(call_kernel(spec, x, params))
    finally:
        conn.close()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (out of memory?)" if -exitcode == signal.SIGKILL else ""
        return f"crashed: killed by {name}{hint}"
    return f"crashed: its process exited with code {exitcode}"


def call_kernel_isolated(
    spec: KernelSpec, x: np.ndarray, params: dict[str, float], timeout: float | None
) -> Outcome:
    """call_kernel in a child process: a segfault, an out-of-memory kill or a hang past
    `timeout` seconds becomes a failed Outcome instead of taking the run down."""
    ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(spec, x, params, send), daemon=True)
    start = time.perf_counter()
    proc.start()
    send.close()
    try:
        if not recv.poll(timeout):
            proc.kill()
            proc.join()
            return Outcome(None, f"timed out after {timeout:g}s", False, False,
                           time.perf_counter() - start)
        try:
            outcome = recv.recv()
        except EOFError:  # died before it could answer
            proc.join()
            return Outcome(None, _death(proc.exitcode), False, False,
                           time.perf_counter() - start)
        proc.join()
        return outcome
    finally:
        recv.close()
        if proc.is_alive():
            proc.kill()
