"""Results handed from a reference process to its parent through files in memory (tmpfs):
each large array is written to a file of its own and read back once, the rest pickled as
usual. Through the pool's pipe the same array is pickled, written in pieces, read in pieces
and unpickled: four copies and the pipe's small writes, where a file costs two copies."""

from __future__ import annotations

import io
import os
import pickle
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

LARGE = 1 << 16  # bytes: an array at least this large goes through a file


@contextmanager
def folder(prefix: str = "elasticbench-") -> Iterator[Path]:
    """A folder for hand-over files, in memory where Linux has /dev/shm; removed on leaving
    with whatever was not taken (a batch dropped by an error or an interrupt)."""
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix=prefix, dir=where) as name:
        yield Path(name)


class _Packer(pickle.Pickler):
    def __init__(self, file: io.BytesIO, where: Path) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.where = where

    def reducer_override(self, obj: Any) -> Any:
        # C-contiguous plain arrays only: a file holds C order, and the pickle keeps the rest
        if (type(obj) is not np.ndarray or obj.nbytes < LARGE or obj.dtype.hasobject
                or not obj.flags.c_contiguous):
            return NotImplemented
        fd, name = tempfile.mkstemp(dir=self.where, suffix=".bin")
        with os.fdopen(fd, "wb") as f:
            obj.tofile(f)
        return _take, (name, obj.dtype, obj.shape)


def pack(obj: Any, where: Path) -> bytes:
    """obj pickled, its large arrays written to files in `where` (read back by unpack)."""
    buf = io.BytesIO()
    _Packer(buf, where).dump(obj)
    return buf.getvalue()


def unpack(data: bytes) -> Any:
    """What pack was given; each array's file is read and removed."""
    return pickle.loads(data)


def discard(data: bytes) -> None:
    """Remove the files of a packed result that will not be unpacked (a dropped batch)."""
    _Dropper(io.BytesIO(data)).load()


class _Dropper(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _drop if (module, name) == (__name__, "_take") else super().find_class(module,
                                                                                       name)


def _drop(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    os.unlink(name)


def _take(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    a = np.fromfile(name, dtype=dtype).reshape(shape)
    os.unlink(name)
    return a
