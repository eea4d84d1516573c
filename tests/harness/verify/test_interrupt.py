"""Interrupted verification keeps its records, exits 130, and --resume finishes the rest."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SLOW = textwrap.dedent("""
    import time
    import numpy as np
    from elasticbench import register_kernel

    @register_kernel(function="softmax", backend="numpy", name="slow_softmax")
    def slow_softmax(x):
        time.sleep(0.15)
        xf = x.astype(np.float64)
        m = xf.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        e = np.where(np.isposinf(xf).any(axis=-1, keepdims=True), np.isposinf(xf),
                     np.exp(xf - m))
        s = e.sum(axis=-1, keepdims=True)
        y = np.divide(e, s, out=np.zeros_like(e), where=s > 0)
        y[np.isnan(xf).any(axis=-1)] = np.nan
        return y.astype(x.dtype)
""")


def _cases() -> int:
    from elasticbench.harness.verify.matrix import builtin_case, expand, load_matrix

    return len(expand(load_matrix(builtin_case("verify-quick")), ["softmax"], ["fp32", "fp16"]))


def _verify(tmp: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "elasticbench", "verify", "--quick", "-d", "fp32,fp16",
            "--kernel-file", str(tmp / "slow.py"), *extra]


@pytest.mark.ci  # end to end in child processes: CI runs it, make test keeps its 5 minutes
def test_sigterm_keeps_records_and_resume_completes(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    out = tmp_path / "v.json"
    proc = subprocess.Popen(_verify(tmp_path, "--json", str(out)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until some records are on disk
        if out.exists() and json.loads(out.read_text())["records"]:
            break
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted:" in err and f"--resume {out}" in err and "Traceback" not in err
    partial = json.loads(out.read_text())
    assert partial["complete"] is False
    first = len(partial["records"])
    assert 0 < first < _cases()

    done = subprocess.run(_verify(tmp_path, "--resume", str(out)), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    final = json.loads(out.read_text())
    assert final["complete"] is True and final["resumed"] == 1
    keys = [(r["dtype"], r["input"], tuple(r["shape"]), r["layout"]) for r in final["records"]]
    assert len(keys) == len(set(keys)) == _cases()  # every case once: nothing redone or lost
    assert final["records"][:first] == partial["records"]


def test_resume_refuses_a_file_of_another_kind(cli, tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps({"schema": "elasticbench.run/1", "records": []}))
    r = cli("verify", "--quick", "--resume", str(bad))
    assert r.code == 2 and "expected elasticbench.verify/1" in r.err
    assert bad.read_text() == json.dumps({"schema": "elasticbench.run/1", "records": []})


def test_an_interrupt_drops_the_queued_reference_work(monkeypatch):
    """Interrupted while the reference is computed in worker processes, solve returns at
    once: the queued chunks are cancelled (before, leaving the pool waited for all of them,
    so a Ctrl-C during a large verify or hunt hung until the whole reference was done)."""
    import numpy as np
    import pytest

    from elasticbench.harness.numerics.truth import cache as truth_cache

    shutdowns = []

    class Pool(truth_cache.ProcessPoolExecutor):
        def shutdown(self, wait=True, *, cancel_futures=False):
            shutdowns.append(cancel_futures)
            super().shutdown(wait, cancel_futures=cancel_futures)

    monkeypatch.setattr(truth_cache, "ProcessPoolExecutor", Pool)
    _everything_to_mpmath(monkeypatch)
    x = np.random.default_rng(0).normal(size=(16, 4096))
    jobs = [truth_cache.TruthJob("softmax", (), "fp32", x + i, np.arange(16), 128)
            for i in range(4)]

    def interrupt(_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        truth_cache.solve(jobs, truth_cache.TruthStore(None), workers=2, progress=interrupt)
    assert shutdowns and shutdowns[0] is True


def _everything_to_mpmath(monkeypatch):
    """Make the certified phase leave every row to mpmath (the pool's work)."""
    import numpy as np

    from elasticbench.harness.numerics.truth import cache as truth_cache

    fast = truth_cache.fast_phase

    def nothing_certified(job):
        truth, ok = fast(job)
        return truth, np.zeros_like(ok)

    monkeypatch.setattr(truth_cache, "fast_phase", nothing_certified)


def _killed(_chunk):
    """A reference worker's chunk that ends in SIGKILL, as the OOM killer sends it."""
    import os

    os.kill(os.getpid(), signal.SIGKILL)


def test_a_reference_worker_that_dies_is_one_clear_error(monkeypatch):
    """A worker killed mid-chunk (the OOM killer, a signal) ends solve with an error naming
    the case, instead of a parent waiting for it forever."""
    import numpy as np
    import pytest

    from elasticbench.harness.numerics.truth import cache as truth_cache

    _everything_to_mpmath(monkeypatch)

    monkeypatch.setattr(truth_cache, "_evaluate", _killed)
    x = np.random.default_rng(0).normal(size=(16, 4096))
    job = truth_cache.TruthJob("elastic", (("tau", 1.0), ("beta", 0.5)), "fp32", x,
                               np.arange(16), 128)
    with pytest.raises(truth_cache.TruthError, match=r"elastic fp32 16x4096 \(tau=1, beta=0.5\)"):
        truth_cache.solve([job], truth_cache.TruthStore(None), workers=2)


def test_verify_reports_a_dead_reference_worker_in_one_line(cli, tmp_path, monkeypatch):
    """Through the CLI: exit 2, one line, the finished records kept in the results file."""
    import json

    from elasticbench.harness.numerics.truth import cache as truth_cache

    def die(*_args, **_kw):
        raise truth_cache.TruthError("a reference worker died (killed, or out of memory) "
                                     "while evaluating softmax fp32 2x64 in mpmath")

    monkeypatch.setattr(truth_cache, "_fallback", die)
    _everything_to_mpmath(monkeypatch)
    out = tmp_path / "v.json"
    r = cli("verify", "--quick", "-f", "softmax", "-d", "fp32", "--only", "numpy_softmax",
            "--json", str(out))
    assert r.code == 2
    assert r.err.strip().splitlines()[-1].startswith("elasticbench: error: a reference worker died")
    assert "Traceback" not in r.err
    doc = json.loads(out.read_text())
    assert doc["complete"] is False


def test_a_reference_process_that_dies_is_one_clear_error(cli, tmp_path, monkeypatch):
    """The reference runs in a process of its own beside the kernels; killed (the OOM
    killer), it ends verify with one line naming the batch, exit 2, the records kept."""
    import json
    import os

    from elasticbench.harness.verify import verifier

    def killed(*_args, **_kw):
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(verifier, "prepare", killed)  # runs in the (forked) reference process
    out = tmp_path / "v.json"
    r = cli("verify", "--quick", "-f", "softmax", "-d", "fp32", "--only", "numpy_softmax",
            "--json", str(out))
    assert r.code == 2
    last = r.err.strip().splitlines()[-1]
    assert last.startswith("elasticbench: error: the reference process died")
    assert "softmax fp32" in last and "Traceback" not in r.err
    assert json.loads(out.read_text())["complete"] is False
