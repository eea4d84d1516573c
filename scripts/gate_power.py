"""Measure the A/B gate's false-alarm rate and power on this machine (not a test: it times).

    .venv/bin/python scripts/gate_power.py --trials 20 --out results/gate_power.json

Scenarios, each gated `trials` times with a fresh seed (kernel files in examples/ab/):
A/A (base against itself), 25% slower, 5% slower, and a faster kernel with a 1e-4 relative
error. Each gate runs exactly what `elasticbench ab` runs (interleaved rounds, paired
statistics, the default 10% threshold and alpha 0.01); the numerics of each pair are verified
once per scenario and reused for its trials, since they do not depend on timing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from elasticbench.bench.cases import load_run_case, parse_size
from elasticbench.gate.ab import ABPolicy, run_ab, versions_from_files
from elasticbench.gate.compare import compare
from elasticbench.verify.matrix import builtin_case

HERE = Path(__file__).resolve().parent.parent / "examples" / "ab"
SCENARIOS = {"A/A": "base.py", "25% slower": "slow25.py", "5% slower": "slow5.py",
             "1e-4 error, faster": "inaccurate.py"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--accuracy-trials", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--size", action="append", default=None, help="ROWSxN (repeatable)")
    ap.add_argument("--scenario", action="append", choices=list(SCENARIOS), default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    case = load_run_case(builtin_case("quick"))
    shapes = [parse_size(s) for s in (args.size or ["64x4096", "64x16384"])]
    summary = {"machine_load_start": os.getloadavg(), "rounds": args.rounds,
               "threads": args.threads, "shapes": [list(s) for s in shapes], "scenarios": {}}
    for name in args.scenario or list(SCENARIOS):
        trials = args.accuracy_trials if "error" in name else args.trials
        pairs = versions_from_files(str(HERE / "base.py"), str(HERE / SCENARIOS[name]))
        numerics = None
        outcomes = []
        t0 = time.perf_counter()
        for trial in range(trials):
            res = run_ab(pairs, case, ["fp32"], shapes,
                         ABPolicy(rounds=args.rounds, seed=trial, threads=args.threads),
                         verify=numerics is None)
            if numerics is None:
                numerics = (res.base.numerics, res.current.numerics)
            res.base.numerics, res.current.numerics = numerics
            cmp = compare(res.base, res.current, paired=True)
            outcomes.append({
                "failed": cmp.failed,
                "timing_regressions": len(cmp.timing_regressions),
                "numerics_regressions": len(cmp.numerics_regressions),
                "ratios": [round(r.est.ratio, 4) for r in cmp.rows if r.est],
                "lo": [round(r.est.lo, 4) for r in cmp.rows if r.est],
                "verdicts": [r.verdict for r in cmp.rows],
                "load": os.getloadavg()[0]})
            print(f"{name:>20} trial {trial + 1:2d}: {'FAIL' if cmp.failed else 'pass'} "
                  f"ratios {outcomes[-1]['ratios']} lo {outcomes[-1]['lo']} "
                  f"{outcomes[-1]['verdicts']} load {outcomes[-1]['load']:.1f}", flush=True)
        failed = sum(o["failed"] for o in outcomes)
        summary["scenarios"][name] = {"trials": trials, "gates_failed": failed,
                                      "seconds": round(time.perf_counter() - t0, 1),
                                      "outcomes": outcomes}
        print(f"== {name}: gate failed {failed}/{trials}", flush=True)
    summary["machine_load_end"] = os.getloadavg()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    for name, s in summary["scenarios"].items():
        print(f"{name:>20}: gate failed {s['gates_failed']}/{s['trials']}")
    sys.exit(0)


if __name__ == "__main__":
    main()
