"""Results handed from a reference process through files: what goes in comes out, arrays by
value with their dtype, shape and order, and no file is left behind once unpacked."""

from __future__ import annotations

import mmap
import pickle
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from elasticbench.harness import handoff


@dataclass
class Held:
    x: np.ndarray
    label: str


def test_large_arrays_go_through_files_and_come_back_equal(tmp_path):
    rng = np.random.default_rng(0)
    big = rng.standard_normal((300, 70))  # 168000 bytes: a file
    small = rng.standard_normal(8)  # pickled with the rest
    bf16 = rng.standard_normal((128, 512)).astype(ml_dtypes.bfloat16)
    fortran = np.asfortranarray(rng.standard_normal((200, 60)))  # kept in the pickle
    strided = big[:, ::2]  # not contiguous: kept in the pickle
    words = np.array(["a", None] * 5000, dtype=object)
    obj = ([Held(big, "b"), small], {"bf16": bf16, "f": fortran, "s": strided}, words, 3.5)

    data = handoff.pack(obj, tmp_path)
    files = sorted(tmp_path.iterdir())
    assert len(files) == 2  # big and bf16
    assert big.tobytes()[:4096] not in data and bf16.tobytes()[:4096] not in data
    assert fortran.tobytes(order="F")[:4096] in data  # kept in the pickle
    back = handoff.unpack(data)
    assert list(tmp_path.iterdir()) == []  # each file read once, then removed

    (held, s), d, w, f = back
    assert held.label == "b" and f == 3.5
    for got, want in ((held.x, big), (s, small), (d["bf16"], bf16), (d["f"], fortran),
                      (d["s"], strided), (w, words)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got.view(np.uint8) if got.dtype == bf16.dtype else got,
                              want.view(np.uint8) if want.dtype == bf16.dtype else want)
    assert d["f"].flags.f_contiguous
    # -0.0 and NaN bit patterns survive (a file holds the bytes)
    special = np.array([-0.0, np.nan, np.inf] * 4000)
    again = handoff.unpack(handoff.pack(special, tmp_path))
    assert again.tobytes() == special.tobytes()


def test_the_folder_takes_what_was_never_unpacked_with_it():
    with handoff.folder("eb-test-") as where:
        handoff.pack(np.zeros(1 << 16), where)
        assert len(list(where.iterdir())) == 1
    assert not where.exists()


def test_a_packed_result_is_plain_pickle_to_the_reader(tmp_path):
    data = handoff.pack({"a": np.arange(5)}, tmp_path)
    assert pickle.loads(data)["a"].tolist() == [0, 1, 2, 3, 4]


def test_a_mapped_array_is_a_private_writable_copy_of_its_file(tmp_path):
    """unpack maps each large file rather than reading it: the array is a plain writable ndarray,
    holds its values once the file is removed, and writing to it changes neither the file
    nor another reader's array (a private, copy-on-write mapping)."""
    x = np.arange(handoff.MAP_FROM // 8 + 5, dtype=np.float64)  # large enough to be mapped
    data = handoff.pack(x, tmp_path)
    (name,) = tmp_path.iterdir()
    first = handoff.unpack(data, keep=True)  # the file left for one more reader
    assert type(first) is np.ndarray and first.flags.writeable
    first[:10] = -1.0
    second = handoff.unpack(data)  # reads the file and removes it
    assert not name.exists()
    assert np.array_equal(second, x) and (first[:10] == -1.0).all()
    second[-1] = 7.0
    assert second[-1] == 7.0 and np.array_equal(second[:-1], x[:-1])
    assert isinstance(_root(second), mmap.mmap)  # mapped; a smaller file is read
    small = handoff.unpack(handoff.pack(np.ones(1 << 14), tmp_path))
    assert not isinstance(_root(small), mmap.mmap) and (small == 1.0).all()


def _root(a: np.ndarray):
    """What an array's memory finally belongs to (a buffer's owner for np.frombuffer)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a
