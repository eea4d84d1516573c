"""Results handed from a reference process to its parent through files in memory (tmpfs):
each large array is written to a file of its own and mapped back once (see _read), the
rest pickled as usual. Through the pool's pipe the same array is pickled, written in
pieces, read in pieces and unpickled: four copies and the pipe's small writes, where a
file costs two copies, or one where it is mapped."""

from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
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


def pack(obj: Any, where: Path, whole: bool = False) -> bytes:
    """obj pickled, its large arrays written to files in `where` (read back by unpack);
    whole: the whole pickle in one file (many small objects, records, say)."""
    buf = io.BytesIO()
    _Packer(buf, where).dump(obj)
    if not whole:
        return buf.getvalue()
    fd, name = tempfile.mkstemp(dir=where, suffix=".pickle")
    with os.fdopen(fd, "wb") as f:
        f.write(buf.getbuffer())
    return pickle.dumps(_WholeFile(name), protocol=pickle.HIGHEST_PROTOCOL)


def unpack(data: bytes, keep: bool = False) -> Any:
    """What pack was given; each array's file is read and removed (keep: left in place, for
    the one other reader that unpacks it after)."""
    if not keep:
        return pickle.loads(data)
    return _Keeper(io.BytesIO(data)).load()


def discard(data: bytes) -> None:
    """Remove the files of a packed result that will not be unpacked (a dropped batch)."""
    _Dropper(io.BytesIO(data)).load()


class _Redirected(pickle.Unpickler):
    """An unpickler that reads the files of a pack with another function than _take."""

    instead: Any = None

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name in ("_take", "_whole"):
            return partial(type(self).instead, whole=name == "_whole")
        return super().find_class(module, name)


class _Dropper(_Redirected):
    @staticmethod
    def instead(name: str, *_: Any, whole: bool) -> None:
        if whole:
            _Dropper(io.BytesIO(Path(name).read_bytes())).load()
        os.unlink(name)


class _Keeper(_Redirected):
    @staticmethod
    def instead(name: str, *args: Any, whole: bool) -> Any:
        if whole:
            return _Keeper(io.BytesIO(Path(name).read_bytes())).load()
        return _read(name, *args)


MAP_FROM = 1 << 20  # bytes: a file at least this large is mapped, a smaller one read
# Python before 3.13 keeps a duplicate of the file descriptor for every mapping: large files
# only, so that the arrays alive at once (bounded by memory) hold few descriptors
_UNTRACKED = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def _read(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The file's array. A large one is mapped rather than read: its pages are the file's
    own (tmpfs), a write copies the page it touches (a private mapping), and the memory is
    freed when the array is, its file removed or not: a third of reading the file on a 32 MB
    array."""
    with open(name, "rb") as f:
        if os.fstat(f.fileno()).st_size < MAP_FROM or not hasattr(mmap, "MAP_PRIVATE"):
            return np.fromfile(f, dtype=dtype).reshape(shape)
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE, **_UNTRACKED)
    return np.frombuffer(mapped, dtype=dtype).reshape(shape)


def _take(name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    a = _read(name, dtype, shape)
    os.unlink(name)
    return a


class _WholeFile:
    """Pickles as a reference to a file holding a whole pickle (pack's whole=True)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _whole, (self.name,)


def _whole(name: str) -> Any:
    data = Path(name).read_bytes()
    os.unlink(name)
    return pickle.loads(data)
