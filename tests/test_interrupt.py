"""Interrupted verification keeps its records, exits 130, and --resume finishes the rest."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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
    from elasticbench.verify.matrix import builtin_case, expand, load_matrix

    return len(expand(load_matrix(builtin_case("verify-quick")), ["softmax"], ["fp32", "fp16"]))


def _verify(tmp: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "elasticbench", "verify", "--quick", "-d", "fp32,fp16",
            "--kernel-file", str(tmp / "slow.py"), *extra]


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

    from elasticbench.numerics import truth_cache

    shutdowns = []

    class Pool(truth_cache.ProcessPoolExecutor):
        def shutdown(self, wait=True, *, cancel_futures=False):
            shutdowns.append(cancel_futures)
            super().shutdown(wait, cancel_futures=cancel_futures)

    monkeypatch.setattr(truth_cache, "ProcessPoolExecutor", Pool)
    x = np.random.default_rng(0).normal(size=(16, 4096))
    jobs = [truth_cache.TruthJob("softmax", (), "fp32", x + i, np.arange(16), 128)
            for i in range(4)]

    def interrupt(_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        truth_cache.solve(jobs, truth_cache.TruthStore(None), workers=2, progress=interrupt)
    assert shutdowns and shutdowns[0] is True
