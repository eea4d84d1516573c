"""scripts/gate_power.py's bookkeeping (no timing): the derived case files it runs, and the
targets table it draws from saved measurements."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from elasticbench.harness.bench.cases import load_run_case
from elasticbench.harness.verify.matrix import builtin_case

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gate_power.py"
_spec = importlib.util.spec_from_file_location("gate_power", _SCRIPT)
gate_power = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate_power)


def test_derived_case_replaces_keys_and_keeps_the_rest(tmp_path):
    default = load_run_case(builtin_case("default"))
    path = gate_power.derived_case(builtin_case("default"), tmp_path, "x", threads=1,
                                   exclude=None, timing={"budget_s": 0.3})
    c = load_run_case(path)
    assert c.threads == 1 and c.exclude == ()
    assert c.timing.budget_s == 0.3 and c.timing.processes == default.timing.processes
    assert c.sizes == default.sizes and c.params == default.params
    assert c.baseline == default.baseline and c.verify_inputs == default.verify_inputs


def test_planted_case_is_the_elastic_function_on_one_thread(tmp_path):
    c = load_run_case(gate_power._planted_case(builtin_case("default"), tmp_path))
    assert c.functions == ("elastic",) and c.kernels == () and c.threads == 1
    assert "cpp_elastic" in gate_power.case_kernels(builtin_case("default"))
    assert "torch_softmax" not in gate_power.case_kernels(builtin_case("default"))  # baseline


def _outcome(cases, regressed):
    return {"cases": cases, "regressed": regressed, "failed": bool(regressed),
            "numerics_regressions": 0}


def test_table_counts_caught_pairs_and_false_alarms(tmp_path):
    cases = ["ab_elastic fp32 64x4096", "numpy_elastic fp32 64x4096", "torch_softmax fp32 64x4096"]
    outcomes = [_outcome(cases, ["ab_elastic fp32 64x4096"]),
                _outcome(cases, ["ab_elastic fp32 64x4096", "numpy_elastic fp32 64x4096"]),
                _outcome(cases, [])]
    runs = {"mode": "runs", "processes": 3, "sizes": ["64x4096"], "busy": True, "partial": True,
            "scenarios": {"25% slower + A/A": gate_power._tally("x", outcomes, 0.0, (1, 2, 3))}}
    ab_outcomes = [{"failed": f} for f in (True, True, False)]
    ab = {"mode": "ab", "max_slowdown": "5%", "threads": 1, "rounds": 40, "shapes": [[64, 4096]],
          "busy": False, "scenarios": {
              "10% slower": gate_power._tally("y", ab_outcomes, 0.0, (1, 2, 3)),
              "A/A": gate_power._tally("z", ab_outcomes[2:], 0.0, (1, 2, 3))}}
    (tmp_path / "runs-busy.json").write_text(json.dumps(runs))
    (tmp_path / "ab-idle.json").write_text(json.dumps(ab))
    rows = gate_power.table(argparse.Namespace(out_dir=tmp_path))["markdown"].splitlines()
    caught = next(r for r in rows if r.startswith("| 25% slowdown"))
    alarms = next(r for r in rows if r.startswith("| A/A across processes: the other 2 cases"))
    assert "| 2/3 |" in caught and "a second busy process (stopped early)" in caught
    assert "| 1/3 pairs with a false alarm |" in alarms
    assert rows.index(caught) < next(i for i, r in enumerate(rows) if "`ab`" in r)  # issue order
    assert any("10% slowdown caught" in r and "| 2/3 |" in r and "no extra load" in r
               for r in rows)
    assert any(r.startswith("| A/A false alarms") and "| 0/1 |" in r for r in rows)
    assert (tmp_path / "targets.md").read_text().splitlines() == rows
