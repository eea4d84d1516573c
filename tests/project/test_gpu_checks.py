"""scripts/gpu_checks.sh: its bash parses and its step table adds up (fast, make test), and its
dry run (every step's plumbing on this CPU under Triton's interpreter, tiny shapes) passes and
writes what the device tool brings back: at most 8 files, plain names, no folders (ci)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_checks.sh"
DRIVER = ROOT / "scripts" / "gpu_checks.py"
NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # what the device tool brings back


def _table() -> list[tuple[str, int, str]]:
    """The step table at the top of gpu_checks.sh: (name, share, priority) per row."""
    text = SCRIPT.read_text()
    block = text[text.index("STEPS=(") + len("STEPS=("):text.index("\n)\n")]
    rows = re.findall(r'^\s*"(\S+)\s+(\d+)\s+([a-f])\s+.+"\s*$', block, re.MULTILINE)
    assert rows and len(rows) == len([ln for ln in block.splitlines() if ln.strip()]), block
    return [(name, int(share), prio) for name, share, prio in rows]


def _driver():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_checks
    finally:
        sys.path.pop(0)
    return gpu_checks


def test_the_script_is_valid_bash():
    child = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert child.returncode == 0, child.stderr


def test_the_step_table_adds_up_in_priority_order():
    table = _table()
    names = [name for name, _, _ in table]
    assert sum(share for _, share, _ in table) == 100
    assert sorted(names) == sorted(_driver().STEPS) and len(set(names)) == len(names)
    assert names[:2] == ["env", "install"]
    priorities = [prio for _, _, prio in table]
    assert priorities == sorted(priorities), priorities  # a before b before ... f
    # the driver accepts exactly this table, and refuses one that does not add up
    rows = [f"{n} {s} {p} what" for n, s, p in table]
    assert [s.name for s in _driver().parse_steps(rows)] == names
    name, share, prio = table[0]
    with pytest.raises(ValueError, match="add up to 101"):
        _driver().parse_steps([f"{name} {share + 1} {prio} what", *rows[1:]])


def test_bad_usage_is_one_line_and_exit_2(tmp_path):
    for args in ([], ["--nonsense"], [str(tmp_path / "o"), "soon"]):
        child = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)
        assert child.returncode == 2, (args, child.stderr)
        assert child.stderr.count("\n") == 1 and "Traceback" not in child.stderr, child.stderr


def test_an_out_folder_holding_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    rows = [f"{n} {s} {p} what" for n, s, p in _table()]
    child = subprocess.run([sys.executable, str(DRIVER), str(tmp_path), "60",
                            *(a for r in rows for a in ("--step", r))],
                           capture_output=True, text=True)
    assert child.returncode == 2 and "holds other files (notes.txt)" in child.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def _failed_sections(log: str) -> str:
    """The log's sections of the steps whose header is not rc 0 (else its last lines)."""
    sections = re.split(r"^(?=== \S+ start )", log, flags=re.MULTILINE)
    bad = [sec for sec in sections if re.search(r"^== \S+: rc [1-9]", sec, re.MULTILINE)]
    return "\n".join(sec[-3000:] for sec in bad) or log[-4000:]


def test_each_step_gets_its_share_and_what_the_steps_before_it_left(tmp_path):
    """A stand-in Python that exits at once for every step: each limit is then the shares
    so far (nothing was used), floors aside, and never past SECONDS."""
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env bash\nexit 0\n")
    fake.chmod(0o755)
    table = _table()
    rows = [f"{n} {s} {p} what" for n, s, p in table]
    child = subprocess.run([sys.executable, str(DRIVER), str(tmp_path / "out"), "480",
                            "--python", str(fake), *(a for r in rows for a in ("--step", r))],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    log = (tmp_path / "out" / "log.txt").read_text()
    limits = {m[1]: int(m[2]) for m in re.finditer(r"^== (\S+) start \(limit (\d+) s\)", log,
                                                   re.MULTILINE)}
    assert list(limits) == [name for name, _, _ in table]
    floors = _driver().FLOOR_S
    so_far = 0.0
    for name, share, _ in table:
        so_far += 480 * share / 100
        want = max(so_far, floors.get(name, 0))
        assert want - 2 <= limits[name] <= want, (name, limits)
    assert max(limits.values()) <= 480


@pytest.mark.ci  # a child that imports torch: about 6-9 s
def test_no_gpu_fails_the_env_step_and_skips_the_rest(tmp_path):
    """This machine's torch sees no GPU: outside the dry run that is a failure (exit 1), said
    once, not every step skipped and exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["GPU_CHECKS_PYTHON"] = sys.executable
    child = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "60"],
                           capture_output=True, text=True, env=env, timeout=120)
    log = (tmp_path / "out" / "log.txt").read_text()
    assert child.returncode == 1, log
    assert "FAILED: torch sees no CUDA device" in log
    assert re.search(r"^== env: rc 1 in \d+ s", log, re.MULTILINE)
    later = [name for name, _, _ in _table()][1:]
    assert all(f"== {name}: skipped, env failed" in log for name in later), log
    assert "pip install" not in log
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [s["status"] for s in summary["steps"]][1:] == ["skipped: env failed"] * len(later)


@pytest.mark.ci  # the whole dry run in a child: about 2.5 minutes on 2 cores
def test_the_dry_run_passes_and_writes_what_comes_back(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["GPU_CHECKS_PYTHON"] = sys.executable
    child = subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], capture_output=True,
                           text=True, env=env, timeout=300)
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    assert child.returncode == 0, _failed_sections(log) + child.stderr[-2000:]
    files = sorted(out.iterdir())
    assert len(files) <= 8 and all(f.is_file() and NAME.match(f.name) for f in files), files
    assert {f.name for f in files} == {"log.txt", "figures.jsonl", "summary.json",
                                       "summary.md", "gpu_checks.tar.gz"}
    # one header per step, in the table's order, each rc 0
    headers = re.findall(r"^== (\S+): rc (\d+) in (\d+) s", log, re.MULTILINE)
    assert [h[0] for h in headers] == [name for name, _, _ in _table()], headers
    assert all(rc == "0" for _, rc, _ in headers), headers
    # every figure parses and says where it comes from
    figures = [json.loads(line) for line in (out / "figures.jsonl").read_text().splitlines()]
    keys = {"step", "name", "value", "unit", "device", "commit"}
    assert figures and all(keys <= set(f) for f in figures)
    steps = {f["step"] for f in figures}
    assert {"env", "api", "right", "headline", "rows_sweep"} <= steps, steps
    api = [f for f in figures if f["step"] == "api"]
    from elasticbench import functional, nn
    # one call of every public name (scripts/gpu_library.py)
    assert len(api) == len(functional.__all__) + len(nn.__all__), api
    assert all(f["value"] == 1 for f in api), api
    right = [f for f in figures if f["step"] == "right"]
    assert right and all(f["status"] == "passed" for f in right), right
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] is True
    assert all(s["rc"] == 0 for s in summary["steps"]), summary["steps"]
    # the archive holds each step's own files
    with tarfile.open(out / "gpu_checks.tar.gz") as tar:
        names = set(tar.getnames())
    for path in ("env/env.json", "api/api.json", "right/right.json", "exact/exact.json",
                 "user_path/user_path.json", "headline/headline.json",
                 "train_step/train_step.json", "rows_sweep/rows-sweep.json",
                 "verify/verify.json"):
        assert f"gpu_checks/{path}" in names, sorted(names)
