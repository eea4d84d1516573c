"""scripts/same_records.py: two results files' records equal but for timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "same_records.py"


def _file(tmp_path: Path, name: str, records: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"schema": "elasticbench.verify/1", "records": records}))
    return path


def _rec(**kw) -> dict:
    base = {"kernel": "k", "mode": "fwd", "dtype": "fp32", "input": "normal", "shape": [2, 8],
            "params": {"tau": 1.0}, "seed": 1, "layout": "packed", "max_ulp": 0.5,
            "seconds": 0.1, "compile": {"ok": True, "seconds": 2.0}}
    return {**base, **kw}


def _run(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, paths)], capture_output=True,
                          text=True)


def test_timings_alone_differ(tmp_path):
    a = _file(tmp_path, "a.json", [_rec(), _rec(dtype="bf16")])
    b = _file(tmp_path, "b.json", [_rec(dtype="bf16", seconds=9.0),
                                   _rec(seconds=3.0, compile={"ok": True, "seconds": 1.0})])
    r = _run(a, b)
    assert r.returncode == 0
    assert r.stdout.strip() == "2 and 2 records: equal but for timings"


def test_a_verdict_field_or_a_missing_record_differs(tmp_path):
    a = _file(tmp_path, "a.json", [_rec(), _rec(dtype="bf16")])
    b = _file(tmp_path, "b.json", [_rec(max_ulp=0.75)])
    r = _run(a, b)
    assert r.returncode == 1
    assert "max_ulp: 0.5 != 0.75" in r.stdout
    assert "only in the first" in r.stdout


def test_an_unreadable_file_is_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    r = _run(bad, bad)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
