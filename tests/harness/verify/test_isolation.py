"""A kernel that crashes, hangs or is killed is a failed case, and the run goes on."""

from __future__ import annotations

import json
import textwrap
import time

import numpy as np
import pytest

from elasticbench.harness.execute import call_kernel_isolated
from elasticbench.harness.registry import get_kernel, load_kernel_file

BAD = textwrap.dedent("""
    import ctypes, os, signal, time
    import numpy as np
    from elasticbench import register_kernel

    @register_kernel(function="softmax", backend="numpy", name="segfaults")
    def segfaults(x):
        return ctypes.string_at(0)

    @register_kernel(function="softmax", backend="numpy", name="hangs")
    def hangs(x):
        time.sleep(600)

    @register_kernel(function="softmax", backend="numpy", name="oom_killed")
    def oom_killed(x):
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does

    @register_kernel(function="softmax", backend="numpy", name="raises")
    def raises(x):
        raise ValueError("bad")

    @register_kernel(function="softmax", backend="numpy", name="identity")
    def identity(x):
        return x
""")

X = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 32)


@pytest.fixture
def bad_kernels(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(BAD)
    load_kernel_file(path)
    return path


def test_good_kernel_gives_the_same_answer_isolated():
    direct = get_kernel("numpy_softmax").fn(X.copy())
    out = call_kernel_isolated(get_kernel("numpy_softmax"), X, {}, timeout=60)
    assert out.error is None and np.array_equal(out.output, direct)


@pytest.mark.parametrize(("name", "reason"), [
    ("segfaults", "crashed: killed by SIGSEGV"),
    ("oom_killed", "crashed: killed by SIGKILL (out of memory?)"),
    ("raises", "raised ValueError: bad"),
])
def test_failures_are_recorded_and_the_worker_recovers(bad_kernels, name, reason):
    out = call_kernel_isolated(get_kernel(name), X, {}, timeout=60)
    assert out.output is None and out.error == reason
    again = call_kernel_isolated(get_kernel("numpy_softmax"), X, {}, timeout=60)
    assert again.error is None  # a fresh worker took over


def test_hang_is_cut_at_the_timeout(bad_kernels):
    start = time.perf_counter()
    out = call_kernel_isolated(get_kernel("hangs"), X, {}, timeout=1.0)
    assert out.error == "timed out after 1s"
    assert time.perf_counter() - start < 30


def test_contract_still_checked_in_the_child(bad_kernels):
    assert call_kernel_isolated(get_kernel("identity"), X, {}, 60).returned_input


@pytest.mark.ci  # end to end in child processes: CI runs it, make test keeps its 5 minutes
def test_verify_isolated_records_every_kind_of_failure(cli, bad_kernels, tmp_path):
    out = tmp_path / "v.json"
    r = cli("verify", "--quick", "-d", "fp32", "--input", "normal", "--timeout", "3",
            "--kernel-file", str(bad_kernels), "--json", str(out))
    assert r.code == 1
    reasons = {rec["kernel"]: rec["reason"] for rec in json.loads(out.read_text())["records"]}
    assert reasons["segfaults"] == "crashed: killed by SIGSEGV"
    assert reasons["hangs"] == "timed out after 3s"
    assert reasons["oom_killed"].startswith("crashed: killed by SIGKILL")


@pytest.mark.ci  # end to end in child processes: CI runs it, make test keeps its 5 minutes
def test_run_isolated_keeps_going_past_a_crash(cli, bad_kernels, tmp_path):
    out = tmp_path / "r.json"
    r = cli("run", "--quick", "--isolate", "--only", "segfaults,numpy_softmax",
            "--kernel-file", str(bad_kernels), "--size", "4x256", "-d", "fp32",
            "--json", str(out))
    assert r.code == 1, r.err
    recs = {rec["kernel"]: rec for rec in json.loads(out.read_text())["records"]}
    assert recs["segfaults"]["error"] == "crashed: killed by SIGSEGV"
    assert recs["numpy_softmax"]["median_s"] > 0
