"""`elasticbench run` end to end on a tiny case: exit codes, results file schema, contents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from elasticbench.harness.records import read_results

TINY = """
[run]
functions = ["elastic"]
kernels = ["numpy_elastic", "torch_elastic"]
baseline = "torch_softmax"
dtypes = ["fp32"]
sizes = ["4x256"]
verify = "verify-quick"
verify_inputs = ["normal", "specials"]
[run.timing]
warmup_s = 0
min_reps = 3
max_reps = 5
budget_s = 0.05
min_sample_s = 0.0001
"""


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # the console script's way in and out (entry: no interpreter teardown at the end)
    cmd = [sys.executable, "-c", "from elasticbench.harness.cli import entry; entry()", *args]
    return subprocess.run(cmd, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    (d / "tiny.toml").write_text(TINY)
    out = d / "r.json"
    return _run("run", "--case", "tiny.toml", "--processes", "2", "--json", str(out), cwd=d), out


def test_tiny_run_exit_and_schema(tiny_run):
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stderr
    doc = read_results(out, "run")
    assert doc["schema"] == "elasticbench.run/1" and doc["complete"] is True
    for key in ("machine", "versions", "seed", "threads", "ceilings", "allocator"):
        assert key in doc
    assert doc["policy"]["processes"] == 2
    assert doc["ceilings"]["copy_gbps"] > 0 and doc["ceilings"]["exp_geps"]["fp32"] > 0
    kernels = [r["kernel"] for r in doc["records"]]
    assert kernels[0] == "torch_softmax" and doc["records"][0]["baseline"] is True
    assert set(kernels) == {"torch_softmax", "numpy_elastic", "torch_elastic"}
    for r in doc["records"]:
        assert r["shape"] == [4, 256] and r["cache"] == "in-cache"
        t = r["timing"]
        assert len(t["samples_ns"]) == t["reps"] >= 6
        assert len(t["processes"]) == 2 and sum(t["processes"]) == t["reps"]
        assert t["q1_ns"] <= t["median_ns"] <= t["q3_ns"]
        assert r["min_bytes"] == 2 * 4 * 256 * 4
        assert r["binding"] in ("exp", "memory") and r["pct_roof"] > 0
        assert r["verify"]["status"] in ("pass", "FAIL")
    ranked = [r for r in doc["records"] if r["ranked"]]
    assert all(r["speedup"] is not None for r in ranked)
    assert "elastic (fwd)" in proc.stdout and "records in" in proc.stdout


def test_resume_times_only_what_the_file_lacks(tiny_run):
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    kept = doc["records"][:2]
    cut = out.parent / "cut.json"
    cut.write_text(json.dumps({**doc, "records": kept, "complete": False}))
    again = _run("run", "--case", "tiny.toml", "--resume", str(cut), cwd=out.parent)
    assert again.returncode == 0, again.stderr
    done = json.loads(cut.read_text())
    assert done["complete"] is True and done["resumed"] == 1
    assert done["records"][:2] == kept
    assert [r["kernel"] for r in done["records"]] == [r["kernel"] for r in doc["records"]]


@pytest.mark.parametrize("args,message", [
    (["--size", "0x5"], "rows >= 1"),
    (["--size", "4096"], "ROWSxN"),
    (["--dtype", "fp8"], "unknown dtype"),
    (["--function", "nope"], "unknown function"),
    (["--case", "missing.toml"], "does not exist"),
    (["--case", "x.toml", "--quick"], "cannot be used together"),
    (["--only", "no_such_kernel"], "unknown kernel"),
])
def test_usage_errors_are_one_line_exit_2(tmp_path, args, message):
    proc = _run("run", *args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_bad_case_file_is_one_line(tmp_path):
    (tmp_path / "bad.toml").write_text("[run]\nsizes = ['0x5']\n")
    proc = _run("run", "--case", "bad.toml", cwd=tmp_path)
    assert proc.returncode == 2 and "run.sizes" in proc.stderr


def test_bwd_without_backward_kernels_says_so(tmp_path):
    from elasticbench.harness.registry import list_kernels

    proc = _run("run", "--mode", "bwd", "--only", "none_here", cwd=tmp_path)
    assert proc.returncode == 2
    if not list_kernels(mode="bwd"):
        assert "no backward kernels" in proc.stderr


def test_backward_kernels_are_verified_and_ranked(tmp_path):
    """run --mode bwd checks backward kernels with the backward verifier, so they get a
    verdict and a speedup over the vendor backward like forward kernels."""
    case = TINY.replace('kernels = ["numpy_elastic", "torch_elastic"]',
                        'kernels = ["numpy_elastic_bwd", "torch_elastic_bwd"]\nmode = "bwd"')
    (tmp_path / "bwd.toml").write_text(case)
    out = tmp_path / "b.json"
    proc = _run("run", "--case", "bwd.toml", "--processes", "1", "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    records = {r["kernel"]: r for r in read_results(out, "run")["records"]}
    for name in ("numpy_elastic_bwd", "torch_elastic_bwd"):
        r = records[name]
        assert r["mode"] == "bwd" and r["verify"]["status"] == "pass" and r["verify"]["cases"] > 0
        assert r["ranked"] is True and r["speedup"] > 0
