"""A kernel that crashes, hangs or eats memory is a failed outcome, not a dead run."""

from __future__ import annotations

import ctypes
import os
import signal
import time

import numpy as np

from elasticbench.execute import call_kernel_isolated
from elasticbench.registry import KernelSpec, get_kernel

X = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 32)


def spec(fn) -> KernelSpec:
    return KernelSpec("k", "softmax", "numpy", fn)


def test_good_kernel_gives_the_same_answer_isolated():
    direct = get_kernel("numpy_softmax").fn(X.copy())
    out = call_kernel_isolated(get_kernel("numpy_softmax"), X, {}, timeout=30)
    assert out.error is None and np.array_equal(out.output, direct)


def test_segfault_is_recorded():
    out = call_kernel_isolated(spec(lambda x: ctypes.string_at(0)), X, {}, timeout=30)
    assert out.output is None and out.error == "crashed: killed by SIGSEGV"


def test_hang_is_cut_at_the_timeout():
    start = time.perf_counter()
    out = call_kernel_isolated(spec(lambda x: time.sleep(60)), X, {}, timeout=0.5)
    assert out.error == "timed out after 0.5s"
    assert time.perf_counter() - start < 10


def test_killed_process_is_recorded():
    def oom(x):
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

    out = call_kernel_isolated(spec(oom), X, {}, timeout=30)
    assert out.error == "crashed: killed by SIGKILL (out of memory?)"


def test_exception_and_contract_still_reported():
    def boom(x):
        raise ValueError("bad")

    assert call_kernel_isolated(spec(boom), X, {}, 30).error == "raised ValueError: bad"
    out = call_kernel_isolated(spec(lambda x: x), X, {}, 30)
    assert out.returned_input
