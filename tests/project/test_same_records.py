"""scripts/same_records.py: two results files' records equal but for timings."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "same_records.py"
_spec = importlib.util.spec_from_file_location("same_records", SCRIPT)
assert _spec is not None and _spec.loader is not None
same_records = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(same_records)


def _file(tmp_path: Path, name: str, records: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"schema": "elasticbench.verify/1", "records": records}))
    return path


def _rec(**kw) -> dict:
    base = {"kernel": "k", "mode": "fwd", "dtype": "fp32", "input": "normal", "shape": [2, 8],
            "params": {"tau": 1.0}, "seed": 1, "layout": "packed", "max_ulp": 0.5,
            "seconds": 0.1, "compile": {"ok": True, "seconds": 2.0}}
    return {**base, **kw}


def _run(capsys, *paths: Path) -> tuple[int, str, str]:
    code = same_records.main([str(p) for p in paths])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_timings_alone_differ(tmp_path, capsys):
    a = _file(tmp_path, "a.json", [_rec(), _rec(dtype="bf16")])
    b = _file(tmp_path, "b.json", [_rec(dtype="bf16", seconds=9.0),
                                   _rec(seconds=3.0, compile={"ok": True, "seconds": 1.0})])
    code, out, _ = _run(capsys, a, b)
    assert code == 0
    assert out.strip() == "2 and 2 records: equal but for timings"


def test_a_verdict_field_or_a_missing_record_differs(tmp_path, capsys):
    a = _file(tmp_path, "a.json", [_rec(), _rec(dtype="bf16")])
    b = _file(tmp_path, "b.json", [_rec(max_ulp=0.75)])
    code, out, _ = _run(capsys, a, b)
    assert code == 1
    assert "max_ulp: 0.5 != 0.75" in out
    assert "only in the first" in out


def test_an_unreadable_file_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    code, _, err = _run(capsys, bad, bad)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
