"""The child side of kernel isolation: run pickled calls sent over stdin, answer on stdout.

Started as `python -m elasticbench.harness.worker` by execute.Worker. Each message is an 8-byte
big-endian length and a pickle: a call in, its result out. A fresh interpreter (not a
fork) so that it inherits no OpenMP thread pool: a forked child of a process that has run
a parallel region deadlocks in its own first one.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import struct
import sys
from typing import BinaryIO

from elasticbench.harness.allocator import keep_freed_memory


def read_message(stream: BinaryIO) -> bytes | None:
    """One length-prefixed message, or None at end of stream."""
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack(">Q", head)
    data = stream.read(size)
    return data if len(data) == size else None


def write_message(stream: BinaryIO, data: bytes) -> None:
    stream.write(struct.pack(">Q", len(data)) + data)
    stream.flush()


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer calls until the parent closes the pipe."""
    while (data := read_message(inp)) is not None:
        call = pickle.loads(data)
        write_message(out, pickle.dumps(call(), protocol=pickle.HIGHEST_PROTOCOL))


def main() -> None:
    faulthandler.disable()  # a crash is reported by the parent, in one line
    # Ctrl-C reaches the whole process group; the parent decides what stops, and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Kernels may print: keep fd 1 for messages only by pointing Python's stdout at stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    # as the command itself does: a lane scores whole batches, whose NumPy temporaries would
    # otherwise fault their pages in afresh each time (elasticbench/harness/allocator.py)
    keep_freed_memory()
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
