"""The devices kernels run on, "cpu" or a CUDA device ("cuda", "cuda:1"): the one place that
tells them apart. Backends name their device (elasticbench.harness.backends); the benchmark asks it
here how to wait for it, how to time it and how large its last-level cache is.

A clock times a span of calls. On the host it reads perf_counter_ns around them. On a CUDA
device it records an event before and after them and then waits for the second, so the
wait is outside the span, and it holds the GPU busy before the first event while the host
launches the call, so a span of one call times the call alone; its `flush` evicts the L2 by
zeroing a buffer four times its size (256 MiB at least), also outside the span. Host caches
are not flushed: a cold CPU measurement rotates through input copies larger than the cache
instead (docs/benchmarking.md section 2). The host's last-level cache is the largest cache it
reports, or ELASTICBENCH_LLC_BYTES where that is wrong for the job (a VM that reports its
host's whole L3, shared with other tenants).

It is also the one place that asks what this machine has: a CUDA GPU, Triton (on that GPU or
in its CPU interpreter), the native C++ tier. Backends, the environment recorded with
results, the Triton kernels and the tests' `needs` marker (tests/conftest.py) ask here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from .settings import settings

HOST = "cpu"
DEFAULT_LLC_BYTES = 32 << 20  # when the host's cache sizes cannot be read
LLC_ENV = "ELASTICBENCH_LLC_BYTES"  # the host's last-level cache, instead of the detected one
INTERPRET_ENV = "TRITON_INTERPRET"  # "1": Triton runs kernels in its CPU interpreter


# ---------------------------------------------------------------------------------------
# What this machine has


def has_gpu() -> bool:
    """Whether torch sees a CUDA GPU (False where torch is not installed)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def triton_interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1), even beside a
    GPU."""
    return os.environ.get(INTERPRET_ENV) == "1"


def interpreter_env(on: bool, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of env (by default this process's environment) with Triton's interpreter
    switched on, or off: for a child process that runs Triton kernels on the CPU, or one
    that compiles them."""
    out = {k: v for k, v in (os.environ if env is None else env).items() if k != INTERPRET_ENV}
    if on:
        out[INTERPRET_ENV] = "1"
    return out


def torch_unavailable() -> str | None:
    """Why torch cannot be used here, in one line; None when it can."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed"
    return None


def triton_installed() -> bool:
    """Whether Triton and torch (whose tensors its kernels take) are installed: enough to
    compile Triton kernels for a GPU without one (elasticbench.harness.audit)."""
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_unavailable() -> str | None:
    """Why Triton kernels cannot run in this process, in one line; None when they can: on a
    CUDA GPU, or on the CPU in Triton's interpreter (TRITON_INTERPRET=1)."""
    if not triton_installed():
        return "Triton (or torch) is not installed"
    if has_gpu() or triton_interpreted():
        return None
    return ("Triton needs a CUDA GPU, or TRITON_INTERPRET=1 to run its kernels on the CPU "
            "in Triton's interpreter")


def native_unavailable() -> str | None:
    """Why the native C++ tier cannot run here, in one line; None when it is built (the first
    call builds it, elasticbench.native)."""
    if why := torch_unavailable():
        return why
    from . import native

    return native.unavailable()


def native_unbuildable() -> str | None:
    """Why no build of the native tier can even be tried here (no compiler, say); None when
    the tools are present, and then a build that fails is an error, not an absence."""
    from . import native

    return native.missing_tools()


# ---------------------------------------------------------------------------------------
# Waiting, caches, clocks


class Clock(Protocol):
    """Times the calls made between start() and stop(); stop() returns nanoseconds."""

    name: str
    flushes: bool  # whether flush() evicts the device's last-level cache
    single_call: bool  # whether a span of one call is timed exactly (the host's launch hidden)

    def start(self) -> None: ...

    def stop(self) -> float: ...

    def flush(self) -> None: ...


def is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def synchronize(device: str) -> None:
    """Wait until the device has finished the work handed to it (a no-op on the host)."""
    if is_cuda(device):
        import torch

        torch.cuda.synchronize(device)


def cache_sizes() -> dict[str, int]:
    """The host's data and unified cache sizes in bytes by level name (L1d, L2, L3), from
    sysfs."""
    sizes: dict[str, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            kind = (idx / "type").read_text().strip()
            if kind == "Instruction":
                continue
            level = (idx / "level").read_text().strip()
            text = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1], 1)
        size = int(text.rstrip("KMG")) * mult
        sizes[f"L{level}{'d' if kind == 'Data' else ''}"] = size
    return sizes


def llc_bytes(device: str) -> int:
    """Size of the device's last-level cache: the GPU's L2, the host's largest cache (or
    $ELASTICBENCH_LLC_BYTES, as the process's settings read it)."""
    if is_cuda(device):
        import torch

        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    if (override := settings().llc_bytes) is not None:
        return override
    caches = cache_sizes()
    return max(caches.values()) if caches else DEFAULT_LLC_BYTES


def caches(device: str) -> dict[str, int]:
    """The device's data caches by name (L1d, L2, L3 on the host; a GPU's L2), in bytes."""
    return {"L2": llc_bytes(device)} if is_cuda(device) else cache_sizes()


def clock(device: str) -> Clock:
    """A clock for spans of work on the device."""
    return CudaClock(device) if is_cuda(device) else HostClock()


class HostClock:
    """perf_counter_ns around the span; work on the host is done when the call returns."""

    name = "perf_counter_ns"
    flushes = False
    single_call = False

    def __init__(self) -> None:
        self._t0 = 0

    def start(self) -> None:
        self._t0 = time.perf_counter_ns()

    def stop(self) -> float:
        return float(time.perf_counter_ns() - self._t0)

    def flush(self) -> None:
        pass


class ThreadCPUClock:
    """CPU time of the calling thread around the span: time spent descheduled by other
    processes does not count. Exact only for work done on this thread (a kernel on one
    thread, torch.set_num_threads(1)); `ab --clock cpu` uses it on loaded machines."""

    name = "thread_time_ns"
    flushes = False
    single_call = False

    def __init__(self) -> None:
        self._t0 = 0

    def start(self) -> None:
        self._t0 = time.thread_time_ns()

    def stop(self) -> float:
        return float(time.thread_time_ns() - self._t0)

    def flush(self) -> None:
        pass


class CudaClock:
    """CUDA events around the span, on the current stream; the wait for the end event comes
    after it is recorded, and the L2 flush before the start event, so neither is timed.

    Before the start event the GPU is kept busy for about half a millisecond (a spin that
    touches no memory, so a warm L2 stays warm) while the host launches the call, so the span
    holds the call's device time rather than the host's launch overhead: repeated calls
    timed back to back measured a Triton kernel's Python launch (60-110 us on the H100)
    instead of its 512x4096 softmax.
    """

    name = "cuda_event"
    flushes = True
    single_call = True
    HOLD_CYCLES = 1_000_000  # the spin before the start event: 0.5 ms at 2 GHz

    def __init__(self, device: str) -> None:
        import torch

        self._device = device
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._scratch: Any = None

    def start(self) -> None:
        import torch

        torch.cuda._sleep(self.HOLD_CYCLES)
        self._start.record()

    def stop(self) -> float:
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) * 1e6  # ms -> ns

    def flush(self) -> None:
        if self._scratch is None:
            import torch

            size = max(4 * llc_bytes(self._device), 256 << 20)
            self._scratch = torch.empty(size, dtype=torch.uint8, device=self._device)
        self._scratch.zero_()
