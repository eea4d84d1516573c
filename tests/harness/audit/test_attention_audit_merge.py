"""The attention compile audit run as several processes, one JSON each, joined into the one
file a single run writes (elasticbench/harness/audit/attention_merge.py): what a merge keeps,
and the parts it refuses in one line with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from elasticbench.harness.audit.attention_merge import MergeError, merge

KEYS = {"attention_forward_kernel": "a", "attention_dkdv_kernel": "b",
        "attention_dq_kernel": "c"}


def _report(weight: str, dtype: str, tiles: str, spills: int = 0) -> dict:
    return {"kernel": "fwd", "head_dim": 128, "dtype": dtype, "causal": False,
            "tiles": tiles, "weight": weight, "spills": spills,
            "problems": [f"spills {spills} B per thread"] if spills else []}


def _part(weights: list[str], dtypes: list[str], reports: list[dict], of: int,
          complete: bool = True, commit: str = "c1", **over) -> dict:
    return {"triton": "3.6.0", "arch": 90, "commit": commit, "kernel_sha256": "s",
            "kernel_cache_keys": KEYS, "dtypes": dtypes, "weights": weights,
            "head_dims": [64, 128], "complete": complete, "configurations": len(reports),
            "of": of, "failing": sum(1 for r in reports if r["problems"]), "reports": reports,
            **over}


def test_parts_split_by_weight_merge_into_one_audit() -> None:
    a = _part(["elastic"], ["bf16", "fp16"], [_report("elastic", "bfloat16", "128x64 w8 s3")],
              2)
    b = _part(["symax", "softmax1"], ["bf16", "fp16"],
              [_report("symax", "float16", "64x64 w4 s2", spills=8)], 4, complete=False,
              commit="c2")
    got = merge([a, b])
    assert got["weights"] == ["elastic", "softmax1", "symax"]
    assert got["dtypes"] == ["bf16", "fp16"]
    assert (got["configurations"], got["of"], got["failing"]) == (2, 6, 1)
    assert got["complete"] is False and got["commit"] == "c1"
    assert [p["commit"] for p in got["parts"]] == ["c1", "c2"]
    assert got["reports"] == a["reports"] + b["reports"]
    assert got["kernel_cache_keys"] == KEYS and got["triton"] == "3.6.0"
    assert merge([a, {**b, "complete": True}])["complete"] is True


@pytest.mark.parametrize("other, why", [
    ({"triton": "3.9.0"}, "differ in 'triton'"),
    ({"kernel_cache_keys": {**KEYS, "attention_dq_kernel": "z"}}, "kernel_cache_keys"),
    ({"weights": ["elastic"]}, "both audit elastic bf16"),
    ({"weights": ["symax"], "dtypes": ["fp16"]}, "no part audits"),
    ({"weights": ["softmax"]}, "unknown dtype or weight 'softmax'"),
])
def test_parts_that_are_not_one_audit_are_refused(other, why) -> None:
    a = _part(["elastic"], ["bf16"], [], 1)
    b = {**_part(["symax"], ["bf16"], [], 1), **other}
    with pytest.raises(MergeError, match=why):
        merge([a, b])


def test_the_command_writes_the_merge_or_says_why_not_in_one_line(tmp_path: Path) -> None:
    parts = [tmp_path / "a.json", tmp_path / "b.json"]
    parts[0].write_text(json.dumps(_part(["elastic"], ["bf16"], [], 1)))
    parts[1].write_text(json.dumps(_part(["symax"], ["bf16"], [], 1)))
    out = tmp_path / "merged.json"
    cmd = [sys.executable, "-m", "elasticbench.harness.audit.attention_merge", str(out)]
    run = subprocess.run(cmd + [str(p) for p in parts], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["weights"] == ["elastic", "symax"]
    assert "0 of 2 configurations (complete)" in run.stdout
    parts[1].write_text("{")
    bad = subprocess.run(cmd + [str(p) for p in parts], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "not JSON" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
