"""What `verify` prints about a third-party kernel: every failure, legible cells, raised
kernels with their exception, and reproduce lines that reproduce.

The kernels are small third-party-style files (tests/fixtures/sibling) or written here.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LOWP = str(FIXTURES / "sibling" / "lowp_softmax.py")


@pytest.fixture(autouse=True)
def _plain(monkeypatch):
    for var in ("COLUMNS", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(var, raising=False)


def test_piped_output_is_never_wrapped(cli):
    r = cli("verify", "--quick", "--kernel-file", LOWP, "-d", "bf16", "--input", "specials")
    assert r.code == 1
    line = next(ln for ln in r.out.splitlines() if "reproduce:" in ln)
    assert line.rstrip().endswith(f"--kernel-file {LOWP}"), line
    assert max(len(ln) for ln in r.out.splitlines()) > 80


def _failing(path: Path) -> list[dict]:
    return [r for r in json.loads(path.read_text())["records"] if not r["passed"]]


def _fail_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("FAIL ")]


@pytest.fixture(scope="module")
def lowp(tmp_path_factory) -> tuple[str, Path]:
    """lowp_softmax over the quick matrix: 17 failing cases in 11 groups (see its file; the
    fp16 case of coarse 513x4 fails on the rows a sample keeps for their extreme values)."""
    from elasticbench.harness.cli import main
    from elasticbench.harness.registry import scoped_kernels

    out = tmp_path_factory.mktemp("lowp") / "v.json"
    with pytest.raises(SystemExit) as done, scoped_kernels():
        main(["verify", "--quick", "--kernel-file", LOWP, "--json", str(out)])
    assert done.value.code == 1
    return LOWP, out


def _case(r: dict) -> tuple:
    return (r["input"], tuple(r["shape"]), r.get("layout", "packed"),
            tuple(sorted(r["params"].items())))


def test_every_failing_case_is_shown_grouped_and_worst_first(cli, lowp):
    _, path = lowp
    failing = _failing(path)
    r = cli("report", str(path))
    heads = _fail_lines(r.out)
    groups = {_case(f) for f in failing}
    assert len(failing) == 21 and len(heads) == len(groups) == 12
    for f in failing:  # every failing case, its dtype named in its group's line
        layout = "" if f["layout"] == "packed" else f" {f['layout']}"
        head = next(h for h in heads
                    if f" {f['input']} {f['shape'][0]}x{f['shape'][1]}{layout} " in h)
        assert f["dtype"] in head.split(":")[0]
    # worst first: the special-value failures, then by share of the budget
    assert {h.split(" lowp_softmax ")[1].split(":")[0] for h in heads[:2]} == {
        "specials 7x16 fp64, fp32, fp16, bf16", "masked_specials 4x1025 fp64, fp32, fp16, bf16"}
    fracs = [max(f["max_budget_frac"] for f in failing if _case(f) == g)
             for g in ({_case(f): None for f in sorted(
                 (f for f in failing if "specials" not in f["input"]),
                 key=lambda f: -f["max_budget_frac"])})]
    assert fracs == sorted(fracs, reverse=True)
    assert heads[2].startswith("FAIL lowp_softmax flat 2x8192 bf16: accuracy: ")
    # the limit: the two worst, and a line saying what was left out
    r = cli("report", str(path), "--failures", "2")
    assert _fail_lines(r.out)[:2] == heads[:2]
    assert "FAIL lowp_softmax: 13 more failing cases in 10 groups not shown (--failures)" in r.out


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_documents_show_every_failing_case_too(cli, lowp, fmt):
    _, path = lowp
    r = cli("report", str(path), "-F", fmt)
    assert r.code == 0
    assert r.out.count("reproduce: ") == 12
    assert "flat 2x8192 bf16: accuracy" in r.out


def test_a_cell_says_what_it_counts_and_keeps_special_failures_apart(cli, lowp):
    _, path = lowp
    special = [f for f in _failing(path) if f["input"] == "specials"]
    assert special and all(f["special_ok"] is False and math.isfinite(f["max_ulp"])
                           for f in special)  # the policy failure does not hide the error
    out = cli("report", str(path)).out
    row = next(ln for ln in out.splitlines() if ln.startswith("│ lowp_softmax"))
    assert re.search(r"12/22 failed: [\d.e+]+ ulp, 2 special", row)
    assert "inf" not in row
    assert "cells: worst error in ulps where the special values were right" in out


RAISES = '''
import numpy as np
from elasticbench import register_kernel


def _check(x):
    if x.shape[1] > 100:
        raise ValueError("rows longer than 100 are not supported")


@register_kernel(function="softmax", backend="numpy", name="vr_short_rows")
def vr_short_rows(x):
    _check(x)
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)
'''


def test_a_kernel_that_raised_is_shown_as_raised_with_its_exception(cli, tmp_path):
    path = tmp_path / "vr_raises.py"
    path.write_text(RAISES)
    r = cli("verify", "--quick", "--kernel-file", str(path), "-d", "fp32", "--input", "normal")
    assert r.code == 1
    row = next(ln for ln in r.out.splitlines() if ln.startswith("│ vr_short_rows"))
    assert "1/3 failed: " in row and "1 raised" in row
    assert "ValueError: rows longer than 100 are not supported" in r.out
    assert f"raised at {path}:8 in _check: raise ValueError(" in r.out
    assert "Traceback" not in r.out
    r = cli("verify", "--quick", "--kernel-file", str(path), "-d", "fp32", "--input", "normal",
            "--traceback")
    assert f'File "{path}", line 13, in vr_short_rows' in r.out
    assert "    _check(x)" in r.out and f'File "{path}", line 8, in _check' in r.out


def test_a_kernel_that_always_raises_is_not_drawn_as_special_ok(cli, tmp_path):
    path = tmp_path / "vr_always.py"
    path.write_text(RAISES.replace("> 100", ">= 1"))
    r = cli("verify", "--quick", "--kernel-file", str(path), "-d", "fp32", "--input", "normal")
    row = next(ln for ln in r.out.splitlines() if ln.startswith("│ vr_short_rows"))
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == ["vr_short_rows", "wide", "3/3 failed: 3 raised", "-", "FAIL"]


def _reproduce_lines(text: str) -> list[str]:
    return [ln.split("reproduce: ", 1)[1] for ln in text.splitlines() if "reproduce: " in ln]


def _identity(r: dict) -> tuple:
    return (r["kernel"], r["mode"], r["dtype"], *_case(r))


def _rerun(cli, monkeypatch, line: str, out: Path):
    """A printed command run as the shell would: its VAR=value words set the environment."""
    words = shlex.split(line)
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        monkeypatch.setenv(name, value)
    assert words[:2] == ["elasticbench", "verify"]
    return cli(*words[1:], "--json", str(out))


def _check_reruns(cli, monkeypatch, tmp_path, printed: str, failing: list[dict]) -> None:
    lines = _reproduce_lines(printed)
    assert lines
    seen = []
    for i, line in enumerate(lines):
        r = _rerun(cli, monkeypatch, line, tmp_path / f"again{i}.json")
        assert r.code == 1, line
        again = json.loads((tmp_path / f"again{i}.json").read_text())["records"]
        assert again and not any(a["passed"] for a in again), line  # exactly failing cases
        before = {_identity(f): f for f in failing}
        for a in again:
            assert before[_identity(a)]["reason"] == a["reason"], line
        seen += [_identity(a) for a in again]
    assert sorted(seen) == sorted(_identity(f) for f in failing)  # each case exactly once


def test_every_reproduce_command_reruns_exactly_its_failing_cases(cli, lowp, monkeypatch,
                                                                   tmp_path):
    _, path = lowp
    _check_reruns(cli, monkeypatch, tmp_path, cli("report", str(path)).out, _failing(path))


def test_reproduce_commands_of_backward_kernels_with_parameters(cli, monkeypatch, tmp_path):
    wrong = str(Path(__file__).resolve().parents[3] / "examples" / "wrong_backward.py")
    out = tmp_path / "bwd.json"
    r = cli("verify", "--quick", "--mode", "bwd", "--kernel-file", wrong, "-d", "fp32",
            "--input", "near_exp_limit,all_negative", "--json", str(out))
    assert r.code == 1 and "--param tau=" in r.out and "--mode bwd" in r.out
    _check_reruns(cli, monkeypatch, tmp_path, r.out, _failing(out))


def test_a_pasted_reproduce_command_fails_the_same_case_again(cli, lowp):
    _, path = lowp
    # an explicit environment: the C-level one of a test run may carry a COLUMNS of its own
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("COLUMNS", None)
    printed = cli("report", str(path)).out
    head = next(h for h in _fail_lines(printed) if " flat 2x8192 bf16: " in h)
    line = _reproduce_lines(printed)[_fail_lines(printed).index(head)]
    again = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env,
                           timeout=120)
    assert again.returncode == 1, line + "\n" + again.stderr
    assert _fail_lines(again.stdout) == [head]
    assert again.stdout.rstrip().splitlines()[-1].startswith("1 cases, 0 passed, 1 failed")


def test_special_value_messages_say_what_the_row_held(cli, lowp, tmp_path):
    _, path = lowp
    fwd = [f["reason"] for f in _failing(path) if f["input"] == "specials"]
    assert fwd and all("masked" not in why for why in fwd)  # softmax masks nothing
    assert any("beside the infinite weights of its row" in why for why in fwd)
    bwd = tmp_path / "vr_bwd.py"
    bwd.write_text('''
import numpy as np
from elasticbench import register_kernel


@register_kernel(function="softmax", backend="numpy", name="vr_plain_bwd", mode="bwd")
def vr_plain_bwd(x, y, g):
    yf, gf = y.astype(np.float64), g.astype(np.float64)
    return (yf * (gf - (gf * yf).sum(-1, keepdims=True))).astype(x.dtype)
''')
    out = tmp_path / "b.json"
    cli("verify", "--quick", "--mode", "bwd", "--kernel-file", str(bwd), "-d", "fp32",
        "--input", "specials", "--json", str(out))
    (why,) = [f["reason"] for f in _failing(out)]
    assert why.startswith("special: dx not exactly 0 in a row with infinite weights")


WARNS = '''
import warnings
import numpy as np
from elasticbench import register_kernel


@register_kernel(function="softmax", backend="numpy", name="vr_warns")
def vr_warns(x):
    warnings.warn("vr_warns was called", UserWarning)
    e = np.exp(x - x.max(axis=-1, keepdims=True))  # inf - inf on +inf rows: NumPy warns
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)
'''

GARBAGE = '''
import numpy as np
from elasticbench import register_kernel


def _junk(x):
    d = np.random.default_rng(0).standard_normal(x.shape) * 1e30
    d[0, 0], d[-1, -1] = np.nan, np.inf
    with np.errstate(all="ignore"):
        return d.astype(x.dtype)


@register_kernel(function="elastic", backend="numpy", name="vr_junk")
def vr_junk(x, *, tau, beta):
    return _junk(x)


@register_kernel(function="elastic", backend="numpy", name="vr_junk_bwd", mode="bwd")
def vr_junk_bwd(x, y, g, *, tau, beta):
    return _junk(x), 1e300, float("inf")
'''


def test_kernel_warnings_go_to_the_record_and_the_tool_warns_nothing(cli, tmp_path):
    warns, junk = tmp_path / "vr_warns.py", tmp_path / "vr_junk.py"
    warns.write_text(WARNS)
    junk.write_text(GARBAGE)
    out = tmp_path / "w.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = cli("verify", "--quick", "--kernel-file", str(warns), "-d", "fp32", "--input",
                "normal,specials", "--json", str(out))
        junked = cli("verify", "--quick", "--mode", "both", "--kernel-file", str(junk),
                     "-d", "fp16,bf16", "--input", "specials,huge,subnormal")
    assert r.code == 1 and junked.code == 1
    assert [str(w.message) for w in caught] == []  # neither the kernels' nor the tool's own
    assert "Warning" not in r.err + junked.err
    recs = json.loads(out.read_text())["records"]
    mine = [w for rec in recs for w in rec["warnings"]]
    assert {(w["category"], w["line"]) for w in mine} >= {("UserWarning", 9),
                                                         ("RuntimeWarning", 10)}
    assert all(w["file"] == str(warns) for w in mine)
    assert f"warned vr_warns: UserWarning: vr_warns was called ({warns}:9; in 4 cases)" in r.out


def test_size_and_param_replace_the_matrix_shapes_and_grid(cli, tmp_path):
    out = tmp_path / "one.json"
    r = cli("verify", "--quick", "--only", "numpy_elastic", "-d", "fp32", "--input", "normal",
            "--size", "2x5", "--param", "tau=0.5", "--param", "beta=2", "--json", str(out))
    assert r.code == 0, r.err
    (rec,) = json.loads(out.read_text())["records"]  # one case, though neither is in the matrix
    assert rec["shape"] == [2, 5] and rec["params"] == {"tau": 0.5, "beta": 2.0}
