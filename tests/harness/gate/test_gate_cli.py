"""`elasticbench compare`, `gate`, `baseline save` and `ab` on synthetic files: verdicts and
exit codes. Samples are seeded draws, never timings, so nothing here depends on noise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from elasticbench.harness.gate.load import load

MACHINE = {"cpu": "Test CPU", "arch": "x86_64", "cores": 2, "gpu": None}


def rec(kernel: str, seed: int, scale: float = 1.0, *, shape=(64, 4096), status="pass",
        max_ulp=3.0, n=10, procs=4, between=0.02, error=None) -> dict:
    """A run record timed in `procs` processes of n samples, each process at its own level."""
    rng = np.random.default_rng(seed)
    samples = np.concatenate([1e6 * scale * np.exp(rng.normal(0, between)
                                                   + rng.normal(0, 0.05, n))
                              for _ in range(procs)]).tolist()
    r = {"kernel": kernel, "function": "elastic", "backend": "torch", "mode": "fwd",
         "dtype": "fp32", "shape": list(shape), "params": {"tau": 1.0, "beta": 1.0},
         "generator": "normal", "seed": 0, "baseline": False,
         "min_bytes": 2 * shape[0] * shape[1] * 4,
         "timing": {"samples_ns": samples, "processes": [n] * procs},
         "median_s": float(np.median(samples)) * 1e-9,
         "verify": {"status": status, "cases": 4, "failed": int(status == "FAIL"),
                    "max_ulp": max_ulp,
                    "reason": None if status == "pass" else "accuracy: 840 ulp > budget 4"}}
    if error:
        r = {k: v for k, v in r.items() if k not in ("timing", "median_s")} | {"error": error}
    return r


def write_run(path: Path, records: list[dict], machine=None, copy_gbps=20.0) -> Path:
    path.write_text(json.dumps({"schema": "elasticbench.run/1", "kind": "run",
                                "machine": machine or MACHINE, "commit": "abc",
                                "ceilings": {"copy_gbps": copy_gbps}, "complete": True,
                                "records": records}))
    return path


def two_kernels(seed: int, scale_a=1.0, scale_b=1.0, **kw) -> list[dict]:
    return [rec("k_a", seed, scale_a, **kw), rec("k_a", seed + 1, scale_a, shape=(16, 524288)),
            rec("k_b", seed + 2, scale_b)]


def test_same_code_passes(cli, tmp_path):
    base = write_run(tmp_path / "b.json", two_kernels(1))
    cur = write_run(tmp_path / "c.json", two_kernels(11))
    r = cli("gate", str(base), str(cur))
    assert r.code == 0, r.out + r.err
    assert "PASS" in r.out


def test_25_percent_slower_fails_and_5_percent_passes(cli, tmp_path):
    base = write_run(tmp_path / "b.json", two_kernels(1))
    slow = write_run(tmp_path / "s.json", two_kernels(11, scale_b=1.25))
    r = cli("gate", str(base), str(slow), "--markdown", str(tmp_path / "pr.md"))
    assert r.code == 1 and "1 timing regression" in r.out
    md = (tmp_path / "pr.md").read_text()
    assert md.startswith("### elasticbench gate: ❌ FAIL") and "k_b" in md and "regression" in md
    slight = write_run(tmp_path / "t.json", two_kernels(11, scale_b=1.05))
    assert cli("gate", str(base), str(slight)).code == 0
    # the same 25% passes with a 30% threshold, and with timing advisory
    assert cli("gate", str(base), str(slow), "--max-slowdown", "30%").code == 0
    r = cli("gate", str(base), str(slow), "--timing", "advisory")
    assert r.code == 0 and "(advisory)" in r.out


def test_numerics_regression_fails_even_when_faster(cli, tmp_path):
    base = write_run(tmp_path / "b.json", two_kernels(1))
    worse = two_kernels(11, scale_b=0.7)
    worse[2]["verify"] = rec("k_b", 0, status="FAIL", max_ulp=840.0)["verify"]
    cur = write_run(tmp_path / "c.json", worse)
    r = cli("gate", str(base), str(cur), "--json", str(tmp_path / "cmp.json"))
    assert r.code == 1 and "numerics regression" in r.out
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert doc["failed"] is True
    assert {x["kernel"]: x["verdict"] for x in doc["rows"]}["k_b"] == "faster"
    assert [n["kernel"] for n in doc["numerics"] if n["regression"]] == ["k_b"]


def test_verify_files_budget_crossing_and_pass_to_fail(cli, tmp_path):
    def vdoc(passed, frac):
        return {"schema": "elasticbench.verify/1", "kind": "verify", "machine": MACHINE,
                "records": [{"kernel": "k", "function": "softmax", "dtype": "fp32",
                             "input": "normal", "seed": 1, "shape": [4, 8], "params": {},
                             "passed": passed,
                             "max_ulp": 4 * frac, "max_budget_frac": frac,
                             "reason": None if passed else "accuracy"}]}
    (tmp_path / "v1.json").write_text(json.dumps(vdoc(True, 0.5)))
    (tmp_path / "v2.json").write_text(json.dumps(vdoc(False, 3.0)))
    (tmp_path / "v3.json").write_text(json.dumps(vdoc(True, 0.9)))
    assert cli("gate", str(tmp_path / "v1.json"), str(tmp_path / "v2.json")).code == 1
    assert cli("gate", str(tmp_path / "v1.json"), str(tmp_path / "v3.json")).code == 0
    # a failure that was already there is no regression
    assert cli("gate", str(tmp_path / "v2.json"), str(tmp_path / "v2.json")).code == 0


def test_unusable_input_exits_2_with_one_line(cli, tmp_path):
    base = write_run(tmp_path / "b.json", two_kernels(1))
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"schema": "elasticbench.run/9", "records": []}))
    for bad in (str(other), str(tmp_path / "missing.json")):
        r = cli("gate", str(base), bad)
        assert r.code == 2 and r.err.count("\n") == 1 and "error" in r.err
    (tmp_path / "junk.json").write_text("{not json")
    assert cli("compare", str(base), str(tmp_path / "junk.json")).code == 2
    assert cli("gate", str(base), str(base), "--max-slowdown", "10").code == 2
    assert cli("gate", str(base), str(base), "--alpha", "2").code == 2


def test_compare_reports_rollup_and_not_comparable(cli, tmp_path):
    base = write_run(tmp_path / "b.json", [*two_kernels(1), rec("gone", 5)])
    cur_recs = two_kernels(11, scale_a=1.3)
    cur_recs[2] = rec("k_b", 13, error="raised RuntimeError: boom")
    cur = write_run(tmp_path / "c.json", cur_recs)
    r = cli("compare", str(base), str(cur), "--json", str(tmp_path / "cmp.json"))
    assert r.code == 0
    doc = json.loads((tmp_path / "cmp.json").read_text())
    verdicts = {(x["kernel"], x["case"].split()[1]): x["verdict"] for x in doc["rows"]}
    assert verdicts[("k_a", "64x4096")] == "slower" and verdicts[("k_a", "16x524288")] == "slower"
    assert verdicts[("k_b", "64x4096")] == "not comparable"
    assert verdicts[("gone", "64x4096")] == "not comparable"
    roll = {x["kernel"]: x for x in doc["rollups"]}
    assert 1.2 < roll["k_a"]["geomean_ratio"] < 1.4 and roll["k_a"]["counts"]["slower"] == 2


def test_machines_differ_warning_and_bandwidth_fraction(cli, tmp_path):
    base = write_run(tmp_path / "b.json", two_kernels(1), copy_gbps=20.0)
    # another machine: copy twice as fast and every kernel twice as fast
    faster = [rec(r["kernel"], 11 + i, 0.5, shape=tuple(r["shape"]))
              for i, r in enumerate(two_kernels(1))]
    cur = write_run(tmp_path / "c.json", faster, machine=MACHINE | {"cpu": "Other CPU"},
                    copy_gbps=40.0)
    r = cli("compare", str(base), str(cur), "--json", str(tmp_path / "t.json"))
    assert "machines differ" in r.out and "bandwidth-fraction" in r.out
    assert all(x["verdict"] == "faster" for x in json.loads((tmp_path / "t.json").read_text())
               ["rows"])
    r = cli("gate", str(base), str(cur), "--metric", "bandwidth-fraction",
            "--json", str(tmp_path / "f.json"))
    assert r.code == 0
    rows = json.loads((tmp_path / "f.json").read_text())["rows"]
    assert all(0.9 < x["estimate"]["ratio"] < 1.1 for x in rows)


def pytest_benchmark_doc(seed: int, scale: float, with_data: bool) -> dict:
    rng = np.random.default_rng(seed)
    data = (1e-3 * scale * np.exp(rng.normal(0, 0.02)) * rng.lognormal(0, 0.05, 40)).tolist()
    stats = {"min": min(data), "max": max(data), "median": float(np.median(data)),
             "rounds": 40}
    if with_data:
        stats["data"] = data
    return {"machine_info": {"machine": "x86_64", "processor": "x86_64",
                             "cpu": {"brand_raw": "Test CPU", "count": 2}},
            "commit_info": {"id": "abc"}, "version": "5.1.0",
            "benchmarks": [{"group": None, "name": "test_kernel[torch_elastic-64x4096]",
                            "fullname": "tests/bench/x.py::test_kernel[torch_elastic-64x4096]",
                            "param": "torch_elastic-64x4096",
                            "extra_info": {"kernel": "torch_elastic", "case": "fp32 64x4096"},
                            "stats": stats}]}


def test_pytest_benchmark_files(cli, tmp_path):
    for i in range(3):  # each file is one pytest process
        (tmp_path / f"a{i}.json").write_text(json.dumps(pytest_benchmark_doc(i, 1.0, True)))
        (tmp_path / f"b{i}.json").write_text(json.dumps(pytest_benchmark_doc(10 + i, 1.3,
                                                                             True)))
    (tmp_path / "c.json").write_text(json.dumps(pytest_benchmark_doc(2, 1.3, False)))
    ds = load(tmp_path / "a0.json")
    assert ds.kind == "pytest-benchmark" and ds.machine["cpu"] == "Test CPU"
    [s] = ds.series.values()
    assert s.kernel == "torch_elastic" and s.costs is not None and len(s.costs) == 40
    # one file per side: one process each, so the spread between processes is unknown
    r = cli("gate", str(tmp_path / "a0.json"), str(tmp_path / "b0.json"),
            "--json", str(tmp_path / "one.json"))
    row = json.loads((tmp_path / "one.json").read_text())["rows"][0]
    assert r.code == 0 and row["verdict"] == "inconclusive"
    assert row["estimate"]["processes"] == [1, 1] and 1.2 < row["estimate"]["ratio"] < 1.4
    # three files per side: three processes each
    sides = [f"--{side}={tmp_path / f'{x}{i}.json'}" for side, x in (("base", "a"),
                                                                       ("current", "b"))
             for i in range(3)]
    r = cli("gate", *sides, "--json", str(tmp_path / "three.json"))
    row = json.loads((tmp_path / "three.json").read_text())["rows"][0]
    assert r.code == 1 and row["verdict"] == "slower" and row["estimate"]["processes"] == [3, 3]
    r = cli("gate", str(tmp_path / "a0.json"), str(tmp_path / "c.json"),
            "--json", str(tmp_path / "cmp.json"))
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert r.code == 0 and "--benchmark-save-data" in doc["warnings"][0]
    assert doc["rows"][0]["verdict"] == "not comparable"
    assert cli("gate", str(tmp_path / "a0.json"), str(tmp_path / "b0.json"),
               "--metric", "bandwidth-fraction").code == 2


def test_baseline_save(cli, tmp_path):
    run = write_run(tmp_path / "r.json", two_kernels(1))
    doc = json.loads(run.read_text())
    doc["case_name"] = "quick"
    run.write_text(json.dumps(doc))
    d = tmp_path / "baselines"
    r = cli("baseline", "save", str(run), "--dir", str(d))
    assert r.code == 0 and (d / "quick.json").is_file()
    saved = json.loads((d / "quick.json").read_text())
    assert saved["saved_baseline"]["name"] == "quick" and len(saved["records"]) == 3
    assert cli("baseline", "save", str(run), "--dir", str(d)).code == 2  # exists
    assert cli("baseline", "save", str(run), "--dir", str(d), "--force").code == 0
    assert cli("baseline", "save", str(run), "--dir", str(d), "--name", "../x").code == 2
    assert cli("gate", str(d / "quick.json"), str(run)).code == 0
    doc["complete"] = False
    run.write_text(json.dumps(doc))
    assert cli("baseline", "save", str(run), "--dir", str(d), "--name", "n").code == 2


def test_single_process_runs_apart_by_process_noise_are_inconclusive(cli, tmp_path):
    # Each run timed in one process: samples tight (1%), the two processes 30% apart, as two
    # runs of the same code were on an idle machine. A test on samples is sure of a 1.3x
    # slowdown; with one process per side nothing measures the spread between processes.
    base = write_run(tmp_path / "b.json", [rec("k", 1, procs=1, n=40, between=0.0)])
    cur = write_run(tmp_path / "c.json", [rec("k", 2, 1.3, procs=1, n=40, between=0.0)])
    r = cli("gate", str(base), str(cur), "--json", str(tmp_path / "cmp.json"))
    [row] = json.loads((tmp_path / "cmp.json").read_text())["rows"]
    assert r.code == 0 and "PASS" in r.out
    assert row["verdict"] == "inconclusive" and "noise floor" in row["reason"]
    assert 1.25 < row["estimate"]["ratio"] < 1.35 and row["estimate"]["processes"] == [1, 1]


def test_baseline_from_several_runs_gives_one_process_runs_a_verdict(cli, tmp_path):
    runs = []
    for i in range(4):  # four single-process runs of one plan, a few % apart
        doc = write_run(tmp_path / f"r{i}.json", [rec("k", 10 + i, procs=1, n=20,
                                                      between=0.03)])
        runs.append(str(doc))
    d = tmp_path / "baselines"
    r = cli("baseline", "save", *runs, "--dir", str(d), "--name", "q")
    assert r.code == 0 and "noise floors of 1 series from 4 run(s)" in r.out
    saved = json.loads((d / "q.json").read_text())
    [floor] = saved["noise_floor"]
    assert floor["kernel"] == "k" and floor["df"] == 3 and 0 < floor["sd_log"]["time"] < 0.1
    assert saved["saved_baseline"]["from"] == runs and len(saved["records"]) == 1
    same = write_run(tmp_path / "same.json", [rec("k", 20, procs=1, n=20, between=0.03)])
    slow = write_run(tmp_path / "slow.json", [rec("k", 21, 2.0, procs=1, n=20, between=0.03)])
    r = cli("gate", str(d / "q.json"), str(same), "--json", str(tmp_path / "s.json"))
    [row] = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert r.code == 0 and row["verdict"] == "same"
    assert row["estimate"]["noise_sd_log"] == floor["sd_log"]["time"]
    r = cli("gate", str(d / "q.json"), str(slow))
    assert r.code == 1 and "1 timing regression" in r.out
    # runs of different plans make no baseline
    other = write_run(tmp_path / "o.json", [rec("other", 1)])
    assert cli("baseline", "save", runs[0], str(other), "--dir", str(d), "--name", "x"
               ).code == 2


def test_a_baseline_of_several_runs_knows_the_shift_between_runs(cli, tmp_path):
    # each run's 3 processes agree within 1%, but whole runs land 15% apart: against one
    # run the second looks slower for sure; against a baseline saved from the first three
    # runs the gate knows that runs move together and passes it
    levels = [1.0, 1.15, 0.9, 1.2]
    runs = [write_run(tmp_path / f"r{i}.json",
                      [rec("k", 20 + i, level, procs=3, n=20, between=0.01)])
            for i, level in enumerate(levels)]
    r = cli("gate", str(runs[0]), str(runs[3]))
    assert r.code == 1 and "1 timing regression" in r.out
    d = tmp_path / "baselines"
    assert cli("baseline", "save", *map(str, runs[:3]), "--dir", str(d), "--name", "b").code == 0
    [floor] = json.loads((d / "b.json").read_text())["noise_floor"]
    assert floor["df"] == 6 and floor["run_df"] == 2 and floor["sd_log"]["time"] < 0.03
    assert 0.05 < floor["run_sd_log"]["time"] < 0.3
    r = cli("gate", str(d / "b.json"), str(runs[3]), "--json", str(tmp_path / "g.json"))
    [row] = json.loads((tmp_path / "g.json").read_text())["rows"]
    assert r.code == 0 and row["verdict"] == "same" and row["estimate"]["lo"] < 1
    # a floor entry with a bad run spread is one clear line
    bad = json.loads((d / "b.json").read_text())
    bad["noise_floor"][0]["run_sd_log"] = {"time": -1}
    (d / "bad.json").write_text(json.dumps(bad))
    r = cli("gate", str(d / "bad.json"), str(runs[3]))
    assert r.code == 2 and "run_sd_log" in r.err and "Traceback" not in r.err


def test_several_files_per_side_and_bad_sides(cli, tmp_path):
    base = [write_run(tmp_path / f"b{i}.json", [rec("k", i, procs=1, between=0.02)])
            for i in range(3)]
    cur = [write_run(tmp_path / f"c{i}.json", [rec("k", 10 + i, 1.5, procs=1, between=0.02)])
           for i in range(3)]
    cur[2] = write_run(tmp_path / "c2.json", [rec("k", 12, 1.5, procs=1, status="FAIL")])
    r = cli("gate", str(base[0]), str(cur[0]), "--base", str(base[1]), "--base", str(base[2]),
            "--current", str(cur[1]), "--current", str(cur[2]), "--json",
            str(tmp_path / "cmp.json"))
    doc = json.loads((tmp_path / "cmp.json").read_text())
    [row] = doc["rows"]
    assert row["estimate"]["processes"] == [3, 3] and row["verdict"] == "slower"
    assert r.code == 1 and [n["regression"] for n in doc["numerics"]] == [True]
    for args in ([str(base[0])], ["--base", str(base[0])], [str(base[0]), str(cur[0]),
                                                             str(cur[1])]):
        r = cli("gate", *args)
        assert r.code == 2 and r.err.count("\n") == 1
