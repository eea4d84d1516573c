"""The versions a results file records, and the Triton-facing code on a second Triton.

The interpreter patch (elasticbench/triton_interpreter.py) and the compile audit
(elasticbench/harness/audit) find what they need by feature, so they must work on every Triton from
3.4 to the pinned one. The suite runs on the pinned Triton; with ELASTICBENCH_OTHER_TRITON
set to a version (.ci/run sets 3.6.0, the GPU machines' Triton), the last test installs that
Triton alone into a scratch directory (pip, no dependencies: the rest is this venv's) and runs
the Triton tests again in a child pytest with that directory first on the import path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from elasticbench import devices
from elasticbench.harness.environment import describe, recorded_versions

ROOT = Path(__file__).resolve().parents[3]
OTHER = os.environ.get("ELASTICBENCH_OTHER_TRITON")
SCRATCH = ROOT / ".cache" / "triton"  # one directory per version, kept between runs
TRITON_TESTS = ("library/test_triton_interpreter.py", "library/test_triton.py",
                "harness/audit/test_triton_audit.py", "harness/audit/test_triton_compile.py",
                "library/test_triton_launch.py", "library/test_triton_rows_safety.py",
                "library/test_attention_configs.py", "library/test_triton_attention_launch.py",
                "harness/audit/test_triton_attention_defaults.py",
                "harness/audit/test_triton_rows_audit.py")


def test_version_prints_what_a_results_file_records(cli):
    r = cli("--version")
    assert r.code == 0
    lines = r.out.splitlines()
    recorded = recorded_versions()
    assert lines[0] == f"elasticbench {recorded['elasticbench']}"
    for name in ("numpy", "torch", "triton", "mpmath", "ml_dtypes", "python"):
        assert f"  {name} {recorded[name] or 'not installed'}" in lines
    assert describe(include_gpu=False)["versions"] == recorded
    assert lines[-1].startswith("  commit ")


def _scratch_triton(version: str) -> Path:
    """A directory holding Triton `version` alone (installed on first use); skips the test
    with pip's reason when that version cannot be had (offline, not in the index)."""
    target = SCRATCH / version
    if (target / "triton" / "__init__.py").is_file():
        return target
    partial = SCRATCH / f"{version}.partial"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
           str(partial), f"triton=={version}"]
    try:
        done = subprocess.run(pip, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.skip(f"installing triton=={version} took over 15 minutes (a slow index?)")
    if done.returncode != 0:
        why = [ln for ln in done.stderr.splitlines() if ln.startswith("ERROR")] or ["pip failed"]
        pytest.skip(f"triton=={version} cannot be installed here (offline, or not in the "
                    f"package index): {why[0]}")
    partial.rename(target)
    return target


@pytest.mark.needs("triton", "no_gpu")
@pytest.mark.skipif(OTHER is None, reason="set ELASTICBENCH_OTHER_TRITON=3.6.0 to run the "
                    "Triton tests on a second Triton too (.ci/run does)")
def test_the_triton_tests_pass_on_a_second_triton():
    assert OTHER is not None
    target = _scratch_triton(OTHER)
    path = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p)
    env = {**devices.interpreter_env(on=False), "PYTHONPATH": path,
           "ELASTICBENCH_TEST_TRITON_PATHS": "fused"}
    shown = subprocess.run([sys.executable, "-m", "elasticbench", "--version"], env=env,
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"  triton {OTHER}" in shown.splitlines()  # the child runs on the other Triton
    tests = [str(ROOT / "tests" / name) for name in TRITON_TESTS]
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-n", "2", *tests], env=env, capture_output=True, text=True,
                           timeout=1800)
    tail = (child.stdout + child.stderr)[-6000:]
    assert child.returncode == 0, tail
    assert " passed" in child.stdout and " failed" not in child.stdout, tail
