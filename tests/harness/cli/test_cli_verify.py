"""`elasticbench verify` as a user runs it: exit codes, one-line errors, records, reports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

QUICK = ("--quick",)


def kernel_file(tmp_path: Path, body: str, name: str = "mine.py") -> str:
    p = tmp_path / name
    p.write_text("import numpy as np\nfrom elasticbench import register_kernel\n\n"
                 + textwrap.dedent(body))
    return str(p)


GOOD = """
@register_kernel(function="softmax", backend="numpy", name="user_softmax")
def user_softmax(x):
    xf = x.astype(np.float64)
    m = xf.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(xf - m)
    inf = np.isposinf(xf).any(axis=-1, keepdims=True)
    e = np.where(inf, np.isposinf(xf), e)
    s = e.sum(axis=-1, keepdims=True)
    y = np.divide(e, s, out=np.zeros_like(e), where=s > 0)
    y[np.isnan(xf).any(axis=-1)] = np.nan
    return y.astype(x.dtype)
"""


def test_quick_verification_of_builtins_passes_and_writes_records(cli, tmp_path):
    # the eager and native kernels: torch.compile's variants take a minute to compile on a
    # fresh machine, and have their own checks (the property tests, `make selftest`)
    out = tmp_path / "v.json"
    r = cli("verify", *QUICK, "--function", "elastic", "--dtype", "bf16", "--json", str(out),
            "--only", "numpy_elastic,torch_elastic,cpp_elastic,cpp_elastic_accurate")
    assert r.code == 0, r.out + r.err
    assert "numpy_elastic" in r.out and "torch_elastic" in r.out and "0 failed" in r.out
    doc = json.loads(out.read_text())
    assert doc["schema"] == "elasticbench.verify/1" and doc["complete"] is True
    rec = doc["records"][0]
    for key in ("kernel", "function", "backend", "dtype", "input", "shape", "params",
                "max_ulp", "passed", "reason"):
        assert key in rec
    assert {r["dtype"] for r in doc["records"]} == {"bf16"}
    assert all(r["passed"] and r["max_ulp"] <= 1.0 for r in doc["records"])  # fp32 inside
    assert doc["machine"]["cores"] >= 1 and doc["versions"]["mpmath"]


def test_user_kernel_file_alone_is_verified(cli, tmp_path):
    r = cli("verify", *QUICK, "--kernel-file", kernel_file(tmp_path, GOOD), "-d", "fp32")
    assert r.code == 0, r.out + r.err
    assert "user_softmax" in r.out and "numpy_softmax" not in r.out


def test_seed_variants_are_all_flagged(cli, tmp_path):
    out = tmp_path / "seed.json"
    r = cli("verify", "--kernel-file", "examples/seed_variants.py", "-d", "fp32",
            "--json", str(out))
    assert r.code == 1
    records = json.loads(out.read_text())["records"]
    failed = {r["kernel"]: r for r in records if not r["passed"]}
    assert set(failed) == {"seed_eps_unscaled", "seed_uniform_fallback", "seed_where_mask"}
    # each for the reason that defines it
    by = {k: {r["input"] for r in records if r["kernel"] == k and not r["passed"]}
          for k in failed}
    assert "all_negative" in by["seed_uniform_fallback"]
    assert by["seed_where_mask"] == {"specials", "masked_specials"}  # the NaN rows only
    assert any(r["params"]["beta"] == 1.0 for r in records
               if r["kernel"] == "seed_eps_unscaled" and not r["passed"])
    assert "reproduce: elasticbench verify --only" in r.out


def test_failure_names_the_worst_input(cli, tmp_path):
    body = GOOD.replace("user_softmax", "off_softmax").replace(
        "return y.astype(x.dtype)", "return (y * (1 + 1e-4)).astype(x.dtype)")
    r = cli("verify", *QUICK, "--kernel-file", kernel_file(tmp_path, body), "-d", "fp32",
            "--input", "normal")
    assert r.code == 1
    assert re.search(r"FAIL off_softmax normal \d+x\d+ fp32: accuracy", r.out)
    assert "at row" in r.out and "expected" in r.out and "got" in r.out


def test_kernel_that_raises_is_a_failed_record_and_the_run_goes_on(cli, tmp_path):
    body = GOOD + """
@register_kernel(function="softmax", backend="numpy", name="boom")
def boom(x):
    raise RuntimeError("kaboom")
"""
    out = tmp_path / "r.json"
    r = cli("verify", *QUICK, "--kernel-file", kernel_file(tmp_path, body), "-d", "fp16",
            "--json", str(out))
    assert r.code == 1
    recs = json.loads(out.read_text())["records"]
    assert all(r["passed"] for r in recs if r["kernel"] == "user_softmax")
    assert all(not r["passed"] and "RuntimeError: kaboom" in r["reason"]
               for r in recs if r["kernel"] == "boom")


@pytest.mark.parametrize(("body", "reason"), [
    ("return np.zeros((1, 1), dtype=x.dtype)", "returned shape"),
    ("return np.zeros(x.shape, dtype=np.float64) if x.dtype != np.float64 "
     "else np.zeros(x.shape, np.float32)", "returned dtype"),
    ("x[...] = 0\n    return x.copy()", "modified its input"),
    ("return x", "returned its input"),
    ("return [0.0]", "wrong type"),
])
def test_contract_violations_fail(cli, tmp_path, body, reason):
    src = f"""
@register_kernel(function="softmax", backend="numpy", name="bad")
def bad(x):
    {body}
"""
    out = tmp_path / "r.json"
    r = cli("verify", *QUICK, "--kernel-file", kernel_file(tmp_path, src), "-d", "fp32",
            "--input", "normal", "--json", str(out))
    assert r.code == 1
    assert any(reason in rec["reason"] for rec in json.loads(out.read_text())["records"])


@pytest.mark.parametrize(("args", "message"), [
    (("--function", "softmax2"), "unknown function 'softmax2'"),
    (("--backend", "jax"), "unknown backend 'jax'"),
    (("--dtype", "fp8"), "unknown dtype 'fp8'"),
    (("--only", "nope"), "unknown kernel 'nope'"),
    (("--input", "gauss"), "unknown input 'gauss'"),
    (("--precision", "64"), "at least 128"),
    (("--case", "missing.toml"), "does not exist"),
    (("--json", "/proc/nope/r.json"), "cannot write results file"),
    (("--kernel-file", "nope.py"), "does not exist"),
    (("--quick", "--case", "cases/verify.toml"), "cannot be used together"),
    (("--frobnicate",), "No such option"),
    (("--failures", "abc"), "--failures takes a number or 'all'"),
    (("--param", "foo=1"), "no chosen function has a parameter 'foo'"),
    (("-f", "elastic", "--param", "tau=-1"), "tau must be finite and > 0"),
    (("--param", "tau"), "--param takes NAME=VALUE"),
    (("--size", "0x3"), "a size needs rows >= 1"),
])
def test_bad_usage_is_one_line_and_exit_2(cli, args, message):
    r = cli("verify", *args)
    assert r.code == 2
    assert message in r.err
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_bad_case_file(cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[verify]\ndtypes = ['fp32']\n[[verify.inputs]]\ngenerator = 'normal'\n"
                   "shapes = [[0, 5]]\n")
    r = cli("verify", "--case", str(bad))
    assert r.code == 2 and "shape is [rows, n]" in r.err
    bad.write_text("[verify\n")
    r = cli("verify", "--case", str(bad))
    assert r.code == 2 and "not valid TOML" in r.err


def test_kernel_file_with_syntax_error_names_file_and_line(cli, tmp_path):
    path = kernel_file(tmp_path, "def broken(:\n    pass\n")
    r = cli("verify", "--kernel-file", path)
    assert r.code == 2 and f"{path}:4: syntax error" in r.err


def test_kernel_file_that_raises_on_import_names_the_line(cli, tmp_path):
    path = kernel_file(tmp_path, "x = 1\nraise ImportError('needs cupy')\n")
    r = cli("verify", "--kernel-file", path)
    assert r.code == 2 and f"{path}:5: ImportError: needs cupy" in r.err


def test_kernel_file_with_bad_registration(cli, tmp_path):
    path = kernel_file(tmp_path, """
@register_kernel(function="softmax", backend="cupy")
def k(x):
    return x
""")
    r = cli("verify", "--kernel-file", path)
    assert r.code == 2 and "unknown backend 'cupy'" in r.err


def test_real_process_exit_codes_and_no_traceback(tmp_path):
    exe = [sys.executable, "-m", "elasticbench"]
    bad = subprocess.run([*exe, "verify", "--dtype", "fp8"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    ok = subprocess.run([*exe, "verify", "--quick", "-f", "softmax1", "-d", "fp64"],
                        capture_output=True, text=True, env={"NO_COLOR": "1", "PATH": ""})
    assert ok.returncode == 0, ok.stderr
    assert "\x1b[" not in ok.stdout  # not a terminal: no control codes


@pytest.mark.parametrize(("topic", "expected"), [
    ("functions", "elastic    Elastic-Softmax"),
    ("backends", "numpy"),
    ("inputs", "near_exp_limit"),
    ("kernels", "numpy_elastic"),
    ("cases", "verify.toml"),
])
def test_list(cli, topic, expected):
    r = cli("list", topic)
    assert r.code == 0 and expected in r.out


def test_list_kernels_keeps_its_columns_aligned(cli):
    from elasticbench.harness.registry import list_kernels

    lines = cli("list", "kernels").out.splitlines()
    kernels = list_kernels()
    assert len(lines) == len(kernels)
    # each column starts where it starts on every line, the longest names included
    for col in ("function", "backend", "mode"):
        starts = {ln.index(f" {getattr(k, col)} ", len(k.name)) for ln, k in
                  zip(lines, kernels, strict=True)}
        assert len(starts) == 1, (col, starts)


def test_list_unknown_topic_is_usage_error(cli):
    r = cli("list", "colours")
    assert r.code == 2 and "Invalid value" in r.err
