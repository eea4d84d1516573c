"""`run` on an [attention_run] case with gated cells (`gate = [0, 1]`, docs/attention.md
section 6): the gate goes to the kernels that declare it, the baseline runs ungated beside
them, records say gate in their params, and a bad gate list is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from elasticbench.harness.kinds.attention import run_job
from elasticbench.harness.kinds.attention.qkv_inputs import generate_gate
from elasticbench.harness.kinds.attention.run_case import load_attention_run
from elasticbench.harness.kinds.attention.run_job import AttentionRunJob, attention_bytes

GATED = """
[attention_run]
kernels = ["cpp_cog_attention", "api_attention"]
baseline = "sdpa"
dtypes = ["fp32"]
batch = 1
heads = 2
head_dim = 8
lengths = [16]
causal = [0]
gate = [0, 1]
modes = ["fwd", "bwd"]
seed = 3
[attention_run.timing]
warmup_s = 0.0
min_reps = 3
max_reps = 3
budget_s = 0.01
"""
SHAPE = (1, 2, 16, 16, 8)


@pytest.fixture
def given_gates(monkeypatch):
    """Every (kernel, mode, gate or None) the run hands its kernels, in order."""
    seen: list[tuple[str, str, np.ndarray | None]] = []
    real = run_job.kernel_arguments

    def spy(spec, q, k, v, params, dtype, scale, mask=None, gate=None):
        seen.append((spec.name, spec.mode, None if gate is None else np.asarray(gate)))
        return real(spec, q, k, v, params, dtype, scale, mask, gate)

    monkeypatch.setattr(run_job, "kernel_arguments", spy)
    return seen


def test_gated_cells_give_the_gate_to_declaring_kernels_and_time_the_baseline_ungated(
        cli, tmp_path, given_gates, monkeypatch):
    case = tmp_path / "gated.toml"
    case.write_text(GATED)
    out = tmp_path / "run.json"
    r = cli("run", "--case", str(case), "--json", str(out))
    assert r.code == 0, r.out + r.err
    gated = [(n, m) for n, m, g in given_gates if g is not None]
    # cog in its gated cell, forward and backward (each once to measure memory, then timed:
    # arguments are made once per unit); never SDPA, never api_attention (declares none)
    assert sorted(set(gated)) == [("cpp_cog_attention", "bwd"), ("cpp_cog_attention", "fwd")]
    assert {n for n, _, g in given_gates if g is None} == {"sdpa", "cpp_cog_attention",
                                                          "api_attention"}
    want = generate_gate("normal", "fp32", SHAPE, 3)
    for _, _, g in given_gates:
        if g is not None:
            assert g.shape == (1, 2, 16, 8) and np.array_equal(g, want)
            assert g.min() > 0.0 and g.max() < 1.0
    doc = json.loads(out.read_text())
    recs = {(x["kernel"], x["mode"], x["params"].get("gate", 0.0)): x for x in doc["records"]}
    assert sorted(recs) == sorted([
        (k, m, g) for m in ("fwd", "bwd") for k, g in
        (("sdpa", 0.0), ("sdpa", 1.0), ("cpp_cog_attention", 0.0),
         ("cpp_cog_attention", 1.0), ("api_attention", 0.0))])
    for mode in ("fwd", "bwd"):
        cog, base = recs[("cpp_cog_attention", mode, 1.0)], recs[("sdpa", mode, 1.0)]
        assert cog["params"] == {"causal": 0.0, "gate": 1.0} and base["baseline"]
        # x base of a gated call: the gated cell's (ungated) SDPA over it
        assert cog["speedup"] == pytest.approx(base["median_s"] / cog["median_s"])
        # the gate's bytes count for the gated call, not for the baseline beside it
        assert cog["min_bytes"] == attention_bytes(*SHAPE, 4, mode, gated=True)
        assert base["min_bytes"] == attention_bytes(*SHAPE, 4, mode)
        assert cog["min_bytes"] > recs[("cpp_cog_attention", mode, 0.0)]["min_bytes"]
        verdict = doc["verification"][f"cpp_cog_attention/{mode}/fp32/gated"]
        assert verdict["status"] == "pass" and verdict["cases"] > 0
    assert "api_attention fwd: declares no gate (left out of the gated cells)" in doc["skipped"]
    monkeypatch.setenv("COLUMNS", "200")  # the report's tables wrap at the terminal's width
    rep = cli("report", str(out))
    assert rep.code == 0 and "1x2x16x8 gated cell" in rep.out and "vs ungated" in rep.out


def test_records_without_gate_are_the_ungated_cells(cli, tmp_path):
    """A file written before gated cells (no gate in any params) resumes as the ungated
    cells done: only the gated cells are timed."""
    case = tmp_path / "gated.toml"
    case.write_text(GATED.replace("gate = [0, 1]\n", "").replace(
        '"cpp_cog_attention", "api_attention"', '"cpp_cog_attention"').replace(
        '["fwd", "bwd"]', '["fwd"]'))
    out = tmp_path / "run.json"
    assert cli("run", "--case", str(case), "--json", str(out)).code == 0
    first = json.loads(out.read_text())["records"]
    assert all("gate" not in x["params"] for x in first) and len(first) == 2
    case.write_text(case.read_text().replace("causal = [0]", "causal = [0]\ngate = [0, 1]"))
    r = cli("run", "--case", str(case), "--resume", str(out))
    assert r.code == 0, r.out + r.err
    recs = json.loads(out.read_text())["records"]
    assert recs[:2] == first
    assert [(x["kernel"], x["params"].get("gate")) for x in recs[2:]] == [
        ("sdpa", 1.0), ("cpp_cog_attention", 1.0)]


def test_a_gated_cell_without_a_kernel_that_takes_the_gate_is_not_timed(tmp_path):
    case = tmp_path / "ungateable.toml"
    case.write_text(GATED.replace('"cpp_cog_attention", "api_attention"', '"api_attention"'))
    job = AttentionRunJob(load_attention_run(case), "cpu")
    units = job.plan()
    assert sorted((u.spec.name, u.spec.mode, u.gate) for u in units) == [
        ("api_attention", "bwd", 0), ("api_attention", "fwd", 0), ("sdpa", "bwd", 0),
        ("sdpa", "fwd", 0)]
    assert "api_attention bwd: declares no gate (left out of the gated cells)" in job.skipped


@pytest.mark.parametrize("value", ["[2]", "[]", "[true]", "[0, 0]", '"yes"', "[1.0]"])
def test_a_bad_gate_list_is_one_line(cli, tmp_path, value):
    case = tmp_path / "bad.toml"
    case.write_text(GATED.replace("gate = [0, 1]", f"gate = {value}"))
    r = cli("run", "--case", str(case))
    assert r.code == 2 and "attention_run.gate" in r.err and r.err.count("\n") == 1


def test_the_cpu_cases_plan_cog_beside_the_family_and_the_gated_case():
    root = Path(__file__).resolve().parents[4] / "cases"
    gated = AttentionRunJob(load_attention_run(root / "attention-gated.toml"), "cpu").plan()
    # 2 modes x 2 lengths x 2 causal x 2 gate cells, SDPA and the two kernels in each
    assert len(gated) == 48 and sum(u.gate for u in gated) == 24
    assert {(u.spec.name, u.gated) for u in gated if u.gate} == {
        ("sdpa", False), ("cpp_cog_attention", True), ("cpp_attention", True)}
    family = AttentionRunJob(load_attention_run(root / "attention-family.toml"), "cpu").plan()
    names = {u.spec.name for u in family}
    assert {"cpp_cog_attention", "torch_cog_attention_flash"} <= names
    assert not any(u.gate for u in family)
    assert max(u.length for u in family if u.spec.name == "torch_cog_attention_flash") == 4096
