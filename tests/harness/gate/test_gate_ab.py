"""Same-run A/B: two versions of one kernel name load side by side; a git revision works as
the base; the gate's exit codes hold. Timings are taken but never asserted on."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from elasticbench.harness import registry
from elasticbench.harness.bench.cases import parse_run_table
from elasticbench.harness.gate.ab import (
    ABPolicy,
    run_ab,
    versions_from_files,
    versions_from_revision,
)

KERNEL = '''
import numpy as np
from elasticbench import register_kernel

@register_kernel(function="softmax", backend="numpy", name="mine")
def mine(x):
    """{doc}"""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True) * {factor}).astype(x.dtype)
'''

CASE = {"functions": ["softmax"], "dtypes": ["fp32"], "sizes": ["2x64"],
        "verify": "verify-quick", "verify_inputs": ["normal"], "baseline": ""}


def kernel_file(path: Path, factor: str = "1", doc: str = "v") -> Path:
    path.write_text(KERNEL.format(factor=factor, doc=doc))
    return path


def test_two_versions_of_one_name_load_without_touching_the_registry(tmp_path):
    before = registry.list_kernels()
    pairs = versions_from_files(str(kernel_file(tmp_path / "a.py", doc="A")),
                                str(kernel_file(tmp_path / "b.py", doc="B")))
    assert before == registry.list_kernels()
    [p] = pairs
    assert p.name == "mine" and p.base.name == "mine@base" and p.current.name == "mine@current"
    assert p.base.description == "A" and p.current.description == "B"


def test_run_ab_pairs_samples_round_by_round(tmp_path):
    pairs = versions_from_files(str(kernel_file(tmp_path / "a.py")),
                                str(kernel_file(tmp_path / "b.py")))
    case = parse_run_table(CASE, "test", "t")
    res = run_ab(pairs, case, ["fp32"], [(2, 64)], ABPolicy(rounds=6, warmup_s=0,
                                                          min_sample_s=1e-5), verify=False)
    assert [r["version"] for r in res.records] == ["base", "current"]
    assert all(len(r["timing"]["samples_ns"]) == 6 for r in res.records)
    assert set(res.base.series) == set(res.current.series)
    assert not res.base.numerics


def test_run_ab_skips_a_format_the_kernel_does_not_take(tmp_path):
    # a kernel declaring fp32 only: asked for fp16 too, it is timed in fp32 alone (it would
    # raise on an fp16 input)
    only32 = KERNEL.replace('name="mine")', 'name="mine", dtypes=("fp32",))').replace(
        "return (", "assert x.dtype == np.float32\n    return (")
    for side in ("a", "b"):
        (tmp_path / f"{side}.py").write_text(only32.format(factor="1", doc=side))
    pairs = versions_from_files(str(tmp_path / "a.py"), str(tmp_path / "b.py"))
    case = parse_run_table(CASE, "test", "t")
    res = run_ab(pairs, case, ["fp32", "fp16"], [(2, 64)],
                 ABPolicy(rounds=5, warmup_s=0, min_sample_s=1e-5), verify=False)
    assert [(r["version"], r["dtype"]) for r in res.records] == [("base", "fp32"),
                                                                  ("current", "fp32")]


def test_run_ab_on_the_thread_cpu_clock(tmp_path):
    pairs = versions_from_files(str(kernel_file(tmp_path / "a.py")),
                                str(kernel_file(tmp_path / "b.py")))
    case = parse_run_table(CASE, "test", "t")
    policy = ABPolicy(rounds=5, warmup_s=0, min_sample_s=1e-5, clock="cpu", threads=1)
    res = run_ab(pairs, case, ["fp32"], [(2, 64)], policy, verify=False)
    assert all(r["timing"]["clock"] == "thread_time_ns" and min(r["timing"]["samples_ns"]) > 0
               for r in res.records)
    with pytest.raises(ValueError, match="--threads 1"):  # other threads' work is not seen
        run_ab(pairs, case, ["fp32"], [(2, 64)], replace(policy, threads=2), verify=False)


def test_ab_cli_fails_a_less_accurate_version(cli, tmp_path):
    (tmp_path / "case.toml").write_text(
        "[run]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in CASE.items()) + "\n")
    a = kernel_file(tmp_path / "a.py")
    b = kernel_file(tmp_path / "b.py", factor="(1 + 1e-4)")
    args = ("ab", "--case", str(tmp_path / "case.toml"), "--rounds", "5", "--threads", "1")
    r = cli(*args, "--kernel-file", str(a), "--kernel-file", str(b), "--markdown",
            str(tmp_path / "pr.md"))
    assert r.code == 1, r.out + r.err
    assert "Numerics regressions" in (tmp_path / "pr.md").read_text()
    r = cli(*args, "--kernel-file", str(a), "--kernel-file", str(a))
    assert r.code in (0, 1)  # timing of a 2x64 kernel over 5 rounds decides nothing here
    assert "numerics regression(s)" not in r.out
    assert cli(*args, "--kernel-file", str(a)).code == 2
    assert cli(*args, "--kernel-file", str(a), "--kernel-file", str(tmp_path / "no.py")).code == 2


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], capture_output=True, text=True, check=True).stdout


def test_revision_against_working_tree(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    f = kernel_file(repo / "k.py", doc="old")
    _git(repo, "add", "k.py")
    _git(repo, "commit", "-q", "-m", "v1")
    kernel_file(f, doc="new")
    [p] = versions_from_revision("HEAD", [str(f)], [])
    assert p.base.description == "old" and p.current.description == "new"
    assert len(_git(repo, "worktree", "list").splitlines()) == 1  # cleaned up
    with pytest.raises(ValueError, match="cannot check out"):
        versions_from_revision("no-such-rev", [str(f)], [])
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(p.base.fn(x), p.current.fn(x))
