"""A call's peak resident memory, as the process's high-water mark (Linux's VmHWM, reset
through /proc/self/clear_refs) above its size before the call."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from typing import Any


def _rss_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim_heap() -> None:
    """Give glibc's free heap memory back to the system, so that the resident size before a
    call is what is live and a call that reuses freed memory still shows its peak."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)


def peak_growth(call: Any) -> int | None:
    """Bytes the process's resident peak rose above its size before call() (None where
    Linux's VmHWM cannot be reset)."""
    _trim_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    before = _rss_kib("VmRSS")
    call()
    after = _rss_kib("VmHWM")
    if before is None or after is None:
        return None
    return max(0, after - before) * 1024


