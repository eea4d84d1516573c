"""The C allocator tuned for the reference's many short-lived NumPy temporaries.

glibc returns freed memory at the top of its heap to the system as soon as more than 128 KiB
is free there, and serves allocations above a (dynamic) threshold by mmap; every new block
of double-double temporaries then faults its pages in again (docs/numerics.md section 6.6).
Kept memory is reused by the next block, so the peak is about the same: what changes is
when memory goes back to the system. The heap also grows in steps of TOP_PAD rather than of
each request (fewer faults and system calls: `verify --mode both` 23 -> 17-20 s of system
time), and gives back what lies free above TRIM_THRESHOLD, so that four processes of a
verification (the command, its lane, two reference processes) do not each hold a gigabyte
they no longer use (docs/numerics.md section 6.9).
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit systems
TRIM_THRESHOLD = 128 << 20
TOP_PAD = 128 << 20


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse (True when it agreed); elsewhere (macOS,
    musl, Windows) nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return all(mallopt(k, v) for k, v in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                         (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                                         (M_TOP_PAD, TOP_PAD)))
