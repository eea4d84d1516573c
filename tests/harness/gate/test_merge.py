"""Shards: the split is deterministic, disjoint and complete; merge refuses what does not fit."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from elasticbench.harness.gate.merge import MergeError, merge_docs
from elasticbench.harness.records import read_results
from elasticbench.harness.shards import fingerprint, parse_shard, select_shard, shard_header

ITEMS = [(k, d, [r, n]) for k in ("a", "b", "c") for d in ("fp32", "bf16")
         for r, n in ((64, 4096), (16, 524288), (1, 7))]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 18, 25])
def test_split_is_disjoint_complete_and_balanced(n):
    parts = [select_shard(ITEMS, k, n, key=lambda t: t) for k in range(1, n + 1)]
    flat = [it for p in parts for it in p]
    assert sorted(map(str, flat)) == sorted(map(str, ITEMS)) and len(flat) == len(ITEMS)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_split_does_not_depend_on_order():
    shuffled = ITEMS[:]
    random.Random(3).shuffle(shuffled)
    for k in (1, 2, 3):
        a = select_shard(ITEMS, k, 3, key=lambda t: t)
        b = select_shard(shuffled, k, 3, key=lambda t: t)
        assert sorted(map(str, a)) == sorted(map(str, b))
    assert fingerprint(ITEMS) == fingerprint(shuffled) != fingerprint(ITEMS[1:])


def test_parse_shard():
    assert parse_shard("2/4") == (2, 4) and parse_shard(" 1 / 1 ") == (1, 1)
    for bad in ("0/3", "4/3", "2", "a/b", "-1/2"):
        with pytest.raises(ValueError):
            parse_shard(bad)


def shard_doc(k: int, n: int, items=ITEMS, **head) -> dict:
    mine = select_shard(list(enumerate(items)), k, n, key=lambda t: t[1])
    recs = [{"kernel": it[0], "function": "elastic", "mode": "fwd", "dtype": it[1],
             "shape": it[2], "params": {}, "seed": 0, "baseline": it[0] == "a", "ranked": it[0] != "a",
             "median_s": 1.0 if it[0] == "a" else 0.5, "plan_position": pos}
            for pos, it in mine]
    return {"schema": "elasticbench.run/1", "kind": "run", "case": "c.toml", "seed": 0,
            "complete": True, "ceilings": {"copy_gbps": 10.0 + k},
            "shard": shard_header(k, n, list(items), len(recs)), "records": recs, **head}


def test_merge_combines_in_plan_order_and_recomputes_speedups():
    doc = merge_docs([(f"s{k}", shard_doc(k, 3)) for k in (3, 1, 2)])
    assert [r["plan_position"] for r in doc["records"]] == list(range(len(ITEMS)))
    assert doc["complete"] and doc["shards"]["missing"] == []
    assert all(r["speedup"] == 2.0 for r in doc["records"] if r["kernel"] != "a")
    assert {r["copy_gbps"] for r in doc["records"]} == {11.0, 12.0, 13.0}
    assert "shard" not in doc and len(doc["merged_from"]) == 3


def test_merge_refuses_overlap_duplicates_mismatch_and_gaps():
    s1, s2 = shard_doc(1, 2), shard_doc(2, 2)
    with pytest.raises(MergeError, match="both shard 1/2"):
        merge_docs([("x", s1), ("y", shard_doc(1, 2))])
    with pytest.raises(MergeError, match="different matrices"):
        merge_docs([("x", s1), ("y", shard_doc(2, 3))])
    with pytest.raises(MergeError, match="different matrices"):
        merge_docs([("x", s1), ("y", shard_doc(2, 2, items=ITEMS[:-1]))])
    with pytest.raises(MergeError, match="missing"):
        merge_docs([("x", s1)])
    assert merge_docs([("x", s1)], allow_partial=True)["complete"] is False
    with pytest.raises(MergeError, match="same settings"):
        merge_docs([("x", s1), ("y", shard_doc(2, 2, seed=7))])
    overlapping = shard_doc(2, 2)
    overlapping["records"].append(s1["records"][0])
    with pytest.raises(MergeError, match="overlapping"):
        merge_docs([("x", s1), ("y", overlapping)])
    with pytest.raises(MergeError, match="not a shard file"):
        merge_docs([("x", s1), ("y", {k: v for k, v in s2.items() if k != "shard"})])


TINY = """
[run]
functions = ["elastic"]
kernels = ["numpy_elastic", "torch_elastic"]
baseline = "torch_softmax"
dtypes = ["fp32"]
sizes = ["4x256", "2x128"]
verify = "verify-quick"
verify_inputs = ["normal"]
[run.timing]
warmup_s = 0
min_reps = 3
max_reps = 5
budget_s = 0.05
min_sample_s = 0.0001
"""


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_run_shard_holds_whole_cells_with_their_baseline(tmp_path, n):
    from elasticbench.harness.bench.cases import load_run_case
    from elasticbench.harness.bench.runner import RunJob, plan_units
    from elasticbench.harness.execute import IN_PROCESS
    from elasticbench.harness.registry import get_kernel

    (tmp_path / "tiny.toml").write_text(TINY)
    case = load_run_case(tmp_path / "tiny.toml")
    kernels = [get_kernel(k) for k in ("numpy_elastic", "torch_elastic")]
    plan = plan_units(kernels, get_kernel("torch_softmax"), case, ["fp32", "fp64"],
                      [(4, 256), (2, 128)])
    job = RunJob(case, plan, ["fp32", "fp64"], "cpu", IN_PROCESS)
    parts = [select_shard(job.plan(), k, n, key=job.shard_key) for k in range(1, n + 1)]
    assert sorted(u.position for p in parts for u in p) == list(range(len(plan)))
    def cell(u):
        return (u.dtype, u.shape, u.spec.mode)

    for part in parts:  # every record written in a shard finds its baseline there
        for c in {cell(u) for u in part}:
            assert sorted(u.key for u in part if cell(u) == c) == \
                sorted(u.key for u in plan if cell(u) == c)
            assert any(u.baseline for u in part if cell(u) == c)


def test_run_shards_then_merge_end_to_end(cli, tmp_path, monkeypatch):
    (tmp_path / "tiny.toml").write_text(TINY)
    procs = [subprocess.Popen(
        [sys.executable, "-c", "from elasticbench.harness.cli import main; main()", "run", "--case",
         "tiny.toml", "--shard", f"{k}/2", "--json", f"s{k}.json"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k in (1, 2)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    docs = [read_results(tmp_path / f"s{k}.json", "run") for k in (1, 2)]
    assert [len(d["records"]) for d in docs] == [3, 3]  # 6 units: 3 kernels x 2 shapes
    for d in docs:  # a shard holds whole cells: its records have their speedups as written
        assert sum(x["baseline"] for x in d["records"]) == 1
        assert all(x["speedup"] for x in d["records"] if x["kernel"] == "torch_elastic")
    monkeypatch.chdir(tmp_path)  # the rest needs no process of its own
    r = cli("merge", "s1.json", "s2.json", "-o", "all.json")
    assert r.code == 0, r.err
    merged = read_results(tmp_path / "all.json", "run")
    keys = {(x["kernel"], tuple(x["shape"])) for x in merged["records"]}
    assert len(keys) == 6 and sum(x["baseline"] for x in merged["records"]) == 2
    assert all(x["speedup"] for x in merged["records"] if x["kernel"] == "torch_elastic")
    r = cli("merge", "s1.json", "s1.json", "-o", "bad.json")
    assert r.code == 2 and "both shard 1/2" in r.err
    assert not (tmp_path / "bad.json").exists()
    r = cli("run", "--case", "tiny.toml", "--shard", "3/2", "--json", "x.json")
    assert r.code == 2 and "1 <= K <= N" in r.err
    json.loads((tmp_path / "all.json").read_text())
