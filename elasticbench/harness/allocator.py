"""The C allocator tuned for the reference's many short-lived NumPy temporaries.

glibc returns freed memory at the top of its heap to the system as soon as more than 128 KiB
is free there, and serves allocations above a (dynamic) threshold by mmap; every new block
of double-double temporaries then faults its pages in again (docs/numerics.md section 6.6).
Kept memory is reused by the next block, so the peak is about the same: what changes is
when memory goes back to the system. The heap also grows in steps of TOP_PAD rather than of
each request (fewer faults and system calls: `verify --mode both` 23 -> 17-20 s of system
time). A verification's four processes (the command, its lane, two reference processes)
give back what lies free above SHARED_TRIM_THRESHOLD instead, so that they do not each hold
a gigabyte they no longer use (docs/numerics.md section 6.9).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit systems
TRIM_THRESHOLD = 1 << 30
SHARED_TRIM_THRESHOLD = 128 << 20
TOP_PAD = 128 << 20
TRIM_VARIABLE = "MALLOC_TRIM_THRESHOLD_"  # glibc's own, read as a process starts


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse (True when it agreed), up to TRIM_THRESHOLD
    or the MALLOC_TRIM_THRESHOLD_ of the environment; elsewhere (macOS, musl, Windows)
    nothing changes."""
    mallopt = _mallopt() if sys.platform.startswith("linux") else None
    if mallopt is None:
        return False
    return all(mallopt(k, v) for k, v in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                         (M_TRIM_THRESHOLD, trim_threshold()),
                                         (M_TOP_PAD, TOP_PAD)))


def pin_heap() -> str:
    """For timing (`elasticbench run`): keep freed memory in glibc's heap, mmap off, so a
    kernel that allocates its output each call does not pay fresh page faults each call (as
    a caching allocator would on a GPU); what is in force, in words."""
    mallopt = _mallopt()
    if mallopt is None:
        return "default (mallopt unavailable)"
    ok = mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return "glibc heap, mmap off, trim 1 GiB" if ok else "default (mallopt refused)"


def _mallopt() -> Callable[[int, int], int] | None:
    """The C library's mallopt, or None where it has none (macOS, musl, Windows)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # TypeError: Windows has no CDLL(None)
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return mallopt


def trim_threshold() -> int:
    """TRIM_THRESHOLD, or the environment's MALLOC_TRIM_THRESHOLD_ where it is a number."""
    try:
        trim = int(os.environ.get(TRIM_VARIABLE, TRIM_THRESHOLD))
    except ValueError:  # glibc ignores what it cannot read, and so does this
        trim = TRIM_THRESHOLD
    return min(max(trim, 0), 2**31 - 1)  # mallopt takes an int


def share_memory() -> bool:
    """keep_freed_memory for a command whose processes run side by side: this process and
    those it starts (which inherit the environment) give back what lies free above
    SHARED_TRIM_THRESHOLD, unless the environment says otherwise."""
    os.environ.setdefault(TRIM_VARIABLE, str(SHARED_TRIM_THRESHOLD))
    return keep_freed_memory()
