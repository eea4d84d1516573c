"""Measure the gates' false-alarm rate and power on this machine (not a test: it times).

    .venv/bin/python scripts/gate_power.py ab --trials 20 --out results/gate_power/ab.json
    .venv/bin/python scripts/gate_power.py runs --pairs 20 --out results/gate_power/runs.json
    .venv/bin/python scripts/gate_power.py runs --scenario "25% slower" --pairs 20 --busy
    .venv/bin/python scripts/gate_power.py simulate

`ab`: the same-process A/B gate. Scenarios, each gated `trials` times with a fresh seed
(kernel files in examples/ab/): A/A (base against itself), 25%, 10% and 5% slower, and a faster
kernel with a 1e-4 relative error. Each gate runs exactly what `elasticbench ab` runs
(interleaved rounds, paired statistics, alpha 0.01, --max-slowdown, 10% unless given); the numerics
of each pair are verified once per scenario and reused for its trials.

`runs`: the gate on two separate runs, as a CI job against a committed baseline. Each pair is
two `elasticbench run --processes P` invocations (separate processes, as a baseline from
another day would be) gated with `elasticbench gate` at its defaults. Scenarios: A/A, every
built-in CPU kernel of the case (default: the default case); 25% slower, the base and 25%
slower kernel files of examples/ab/ on the case's shapes with one thread (the planted busy
wait burns a share of process CPU time, which is a share of wall time only on one thread).
--busy keeps a second busy process spinning throughout; --cpus pins everything to a set of
CPUs (e.g. 0,1 to stand for a 2-core machine on a larger one; the busy process takes the last).

`simulate`: the t interval and the hierarchical bootstrap on synthetic processes with a known
answer (no timing): how often each calls identical sides different, and how often it catches
a 25% slowdown, for a given number of processes and spread between them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from elasticbench.bench.cases import load_run_case, parse_size
from elasticbench.gate.ab import ABPolicy, run_ab, versions_from_files
from elasticbench.gate.compare import compare, judge, parse_fraction
from elasticbench.gate.stats import ratio_hierarchical_bootstrap, ratio_processes
from elasticbench.verify.matrix import builtin_case

ROOT = Path(__file__).resolve().parent.parent
AB = ROOT / "examples" / "ab"
AB_SCENARIOS = {"A/A": "base.py", "25% slower": "slow25.py", "10% slower": "slow10.py",
                "5% slower": "slow5.py", "1e-4 error, faster": "inaccurate.py"}
RUN_SCENARIOS = ("A/A", "25% slower")


def ab(args: argparse.Namespace) -> dict[str, Any]:
    case = load_run_case(builtin_case("quick"))
    shapes = [parse_size(s) for s in (args.size or ["64x4096", "64x16384"])]
    summary: dict[str, Any] = {"mode": "ab", "rounds": args.rounds, "threads": args.threads,
                               "max_slowdown": args.max_slowdown, "clock": args.clock,
                               "shapes": [list(s) for s in shapes], "scenarios": {}}
    for name in args.scenario or list(AB_SCENARIOS):
        trials = args.accuracy_trials if "error" in name else args.trials
        pairs = versions_from_files(str(AB / "base.py"), str(AB / AB_SCENARIOS[name]))
        numerics = None
        outcomes = []
        t0 = time.perf_counter()
        for trial in range(trials):
            res = run_ab(pairs, case, ["fp32"], shapes,
                         ABPolicy(rounds=args.rounds, seed=trial, threads=args.threads,
                                  clock=args.clock),
                         verify=numerics is None)
            if numerics is None:
                numerics = (res.base.numerics, res.current.numerics)
            res.base.numerics, res.current.numerics = numerics
            cmp = compare(res.base, res.current, paired=True,
                          max_slowdown=parse_fraction(args.max_slowdown))
            outcomes.append(_outcome(cmp))
            _print(name, trial, outcomes[-1])
        summary["scenarios"][name] = _tally(name, outcomes, t0)
    return summary


@contextmanager
def busy_process(enabled: bool, cpu: str | None):
    """A second process spinning on one CPU for as long as the block runs."""
    if not enabled:
        yield None
        return
    cmd = [sys.executable, "-c", "while True: pass"]
    if cpu is not None:
        cmd = ["taskset", "-c", cpu, *cmd]
    proc = subprocess.Popen(cmd)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _run(out: Path, args: argparse.Namespace, case: Path, kernel_file: Path | None) -> None:
    cmd = [sys.executable, "-m", "elasticbench", "run", "--case", str(case),
           "--processes", str(args.processes), "--json", str(out)]
    if kernel_file is not None:
        cmd += ["--kernel-file", str(kernel_file)]
    if args.cpus:
        cmd = ["taskset", "-c", args.cpus, *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode not in (0, 1):  # 1: a kernel failed its quick verification
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")


def _gate(base: Path, current: Path, out: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "elasticbench", "gate", str(base),
                           str(current), "--json", str(out)], capture_output=True, text=True,
                          cwd=ROOT)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"gate failed ({proc.returncode}): {proc.stderr.strip()}")
    doc = json.loads(out.read_text())
    rows = [r for r in doc["rows"] if r["estimate"]]
    return {"failed": doc["failed"], "load": os.getloadavg()[0],
            "timing_regressions": sum(r["regression"] for r in doc["rows"]),
            "regressed": [f"{r['kernel']} {r['case']}" for r in doc["rows"] if r["regression"]],
            "numerics_regressions": sum(n["regression"] for n in doc["numerics"]),
            "cases": [f"{r['kernel']} {r['case']}" for r in rows],
            "ratios": [round(r["estimate"]["ratio"], 4) for r in rows],
            "lo": [round(r["estimate"]["lo"], 4) for r in rows],
            "noise_sd_log": [r["estimate"]["noise_sd_log"] for r in rows],
            "verdicts": [r["verdict"] for r in doc["rows"]]}


def _planted_case(case: Path, directory: Path) -> Path:
    """The case's shapes and timing for the examples/ab kernel alone, on one thread."""
    c = load_run_case(case)
    timing = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in c.timing.__dict__.items())
    path = directory / "planted.toml"
    path.write_text(f"""[run]
functions = ["elastic"]
baseline = "{c.baseline or ''}"
dtypes = {json.dumps(list(c.dtypes))}
sizes = {json.dumps([f"{r}x{n}" for r, n in c.sizes])}
threads = 1
verify = "{c.verify}"
verify_inputs = ["normal"]
[run.timing]
{timing}
""")
    return path


def runs(args: argparse.Namespace) -> dict[str, Any]:
    case = Path(args.case) if args.case else builtin_case("default")
    summary: dict[str, Any] = {"mode": "runs", "case": str(case), "processes": args.processes,
                               "busy": args.busy, "cpus": args.cpus, "scenarios": {}}
    with tempfile.TemporaryDirectory(prefix="gate-power-") as tmp, \
            busy_process(args.busy, args.cpus.split(",")[-1] if args.cpus else None):
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.scenario or list(RUN_SCENARIOS):
            planted = name != "A/A"
            run_case = _planted_case(case, work) if planted else case
            files = (AB / "base.py", AB / "slow25.py") if planted else (None, None)
            outcomes = []
            t0 = time.perf_counter()
            for pair in range(args.pairs):
                tag = f"{'planted' if planted else 'aa'}{pair}"
                a, b = work / f"{tag}a.json", work / f"{tag}b.json"
                order = [(a, files[0]), (b, files[1])]
                for out, kernel_file in order if pair % 2 == 0 else order[::-1]:
                    _run(out, args, run_case, kernel_file)
                outcomes.append(_gate(a, b, work / f"{tag}cmp.json"))
                _print(name, pair, outcomes[-1])
            summary["scenarios"][name] = _tally(name, outcomes, t0)
    return summary


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)

    def side(k: int, scale: float) -> list[np.ndarray]:
        return [scale * np.exp(rng.normal(0, args.between) + rng.normal(0, args.within, 20))
                for _ in range(k)]

    methods = {"t": ratio_processes, "bootstrap": ratio_hierarchical_bootstrap}
    summary: dict[str, Any] = {"mode": "simulate", "processes": args.processes,
                               "between_sd_log": args.between, "within_sd_log": args.within,
                               "trials": args.trials, "methods": {}}
    for name, fn in methods.items():
        trials = args.trials if name == "t" else max(1, args.trials // 10)
        aa = [judge(fn(side(args.processes, 1.0), side(args.processes, 1.0)), 0.01, 0.10)
              for _ in range(trials)]
        slow = [judge(fn(side(args.processes, 1.0), side(args.processes, 1.25)), 0.01, 0.10)
                for _ in range(trials)]
        summary["methods"][name] = {
            "trials": trials,
            "aa_significant": sum(v[0] in ("slower", "faster") for v in aa) / trials,
            "aa_regressions": sum(v[1] for v in aa) / trials,
            "slow25_caught": sum(v[1] for v in slow) / trials}
        print(f"{name:>10}: {summary['methods'][name]}", flush=True)
    return summary


def _outcome(cmp) -> dict[str, Any]:
    return {"failed": cmp.failed, "timing_regressions": len(cmp.timing_regressions),
            "numerics_regressions": len(cmp.numerics_regressions),
            "ratios": [round(r.est.ratio, 4) for r in cmp.rows if r.est],
            "lo": [round(r.est.lo, 4) for r in cmp.rows if r.est],
            "verdicts": [r.verdict for r in cmp.rows], "load": os.getloadavg()[0]}


def _print(name: str, trial: int, o: dict[str, Any]) -> None:
    print(f"{name:>20} trial {trial + 1:2d}: {'FAIL' if o['failed'] else 'pass'} "
          f"ratios {o['ratios']} lo {o['lo']} {o['verdicts']} load {o['load']:.1f}", flush=True)


def _tally(name: str, outcomes: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    failed = sum(o["failed"] for o in outcomes)
    out = {"trials": len(outcomes), "gates_failed": failed,
           "seconds": round(time.perf_counter() - t0, 1), "outcomes": outcomes}
    line = f"== {name}: gate failed {failed}/{len(outcomes)}"
    if "regressed" in outcomes[0]:  # runs: which kernel made it fail
        planted = sum(any(c.startswith("ab_elastic ") for c in o["regressed"]) for o in outcomes)
        others = sum(any(not c.startswith("ab_elastic ") for c in o["regressed"])
                     for o in outcomes)
        out |= {"planted_caught": planted, "other_false_alarms": others}
        line += f"; the planted kernel caught {planted}, another kernel flagged {others}"
    print(line, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("ab", help="same-process A/B gate")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--accuracy-trials", type=int, default=3)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--size", action="append", default=None, help="ROWSxN (repeatable)")
    p.add_argument("--scenario", action="append", choices=list(AB_SCENARIOS), default=None)
    p.add_argument("--max-slowdown", default="10%", help="the gate's threshold, e.g. 5%%")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    p = sub.add_parser("runs", help="gate on separate runs")
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--case", default=None, help="case file [the default case]")
    p.add_argument("--scenario", action="append", choices=list(RUN_SCENARIOS), default=None)
    p.add_argument("--busy", action="store_true", help="a second busy process throughout")
    p.add_argument("--cpus", default=None, help="pin to these CPUs, e.g. 0,1")
    p.add_argument("--keep", default=None, help="keep the run files in this folder")
    p = sub.add_parser("simulate", help="the interval methods on synthetic processes")
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--between", type=float, default=0.10, help="sd of log process medians")
    p.add_argument("--within", type=float, default=0.03, help="sd of log samples")
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    for p in sub.choices.values():
        p.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    start = os.getloadavg()
    summary = {"ab": ab, "runs": runs, "simulate": simulate}[args.mode](args)
    summary["machine_load_start"], summary["machine_load_end"] = start, os.getloadavg()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    for name, s in summary.get("scenarios", {}).items():
        extra = (f" (planted kernel caught {s['planted_caught']}, another kernel flagged "
                 f"{s['other_false_alarms']})" if "planted_caught" in s else "")
        print(f"{name:>20}: gate failed {s['gates_failed']}/{s['trials']}{extra}")


if __name__ == "__main__":
    main()
