"""Measure the gates' false-alarm rate and power on this machine (not a test: it times).

    .venv/bin/python scripts/gate_power.py targets --out-dir results/gate_power
    .venv/bin/python scripts/gate_power.py ab --trials 20 --out results/gate_power/ab.json
    .venv/bin/python scripts/gate_power.py runs --pairs 20 --out results/gate_power/runs.json
    .venv/bin/python scripts/gate_power.py runs --scenario "25% slower" --pairs 20 --busy
    .venv/bin/python scripts/gate_power.py simulate

`targets`: issue 15's figures, first with no extra load, then with a second busy process:
`ab` A/A and 10% slower (20 trials each, --max-slowdown 5%), and `runs` A/A on the default case
as it is and 25% slower (20 pairs each). Each measurement is written to OUT_DIR as it finishes
(ab-idle.json, runs-idle.json, ab-busy.json, runs-busy.json); then the table (targets.md).
`--combined` measures the runs targets in one pass (scenario "25% slower + A/A"), and
`--size`/`--budget` shrink the runs, to fit a busy machine; `table OUT_DIR` redraws the table.

`ab`: the same-process A/B gate. Scenarios, each gated `trials` times with a fresh seed
(kernel files in examples/ab/): A/A (base against itself), 25%, 10% and 5% slower, and a faster
kernel with a 1e-4 relative error. Each gate runs exactly what `elasticbench ab` runs
(interleaved rounds, paired statistics, alpha 0.01, --max-slowdown, 10% unless given); the numerics
of each pair are verified once per scenario and reused for its trials. --busy as for `runs`.

`runs`: the gate on two separate runs, as a CI job against a committed baseline. Each pair is
two `elasticbench run --processes P` invocations (separate processes, as a baseline from
another day would be; their order alternates) gated with `elasticbench gate` at its defaults.
Scenarios: A/A, every built-in kernel of the case (default: the default case; --only,
--size, --threads, --budget narrow it); 25% slower, the base and 25% slower kernel files of
examples/ab/ on the case's shapes with one thread (the planted busy wait burns a share of
process CPU time, which is a share of wall time only on one thread); "25% slower + A/A", the
planted kernel timed in the same runs as the case's kernels (one thread), which are the same
code on both sides: a pair counts as caught when the planted kernel regressed, and as a false
alarm when any other kernel did. `--against-baseline K` gates each current run against a
baseline saved from the K base runs around it in time (`baseline save`, whose noise floor
knows the shift between runs) instead of against one other run. --busy keeps a second busy process spinning throughout;
--cpus pins everything to a set of CPUs (e.g. 0,1 to stand for a 2-core machine on a larger
one; the busy process takes the last). Every scenario records the load averages at its start
and end (`uptime`'s three figures).

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

from elasticbench.harness.bench.cases import load_run_case, parse_size
from elasticbench.harness.cli.common import choose_kernels
from elasticbench.harness.gate.ab import ABPolicy, run_ab, versions_from_files
from elasticbench.harness.gate.compare import compare, judge, parse_fraction
from elasticbench.harness.gate.stats import ratio_hierarchical_bootstrap, ratio_processes
from elasticbench.harness.verify.matrix import builtin_case
from elasticbench.harness.verify.tables import read_toml

ROOT = Path(__file__).resolve().parent.parent
AB = ROOT / "examples" / "ab"
AB_SCENARIOS = {"A/A": "base.py", "25% slower": "slow25.py", "10% slower": "slow10.py",
                "5% slower": "slow5.py", "1e-4 error, faster": "inaccurate.py"}
RUN_SCENARIOS = ("A/A", "25% slower", "25% slower + A/A")
PLANTED = "ab_elastic"  # the examples/ab kernel's name


def ab(args: argparse.Namespace) -> dict[str, Any]:
    case = load_run_case(builtin_case("quick"))
    shapes = [parse_size(s) for s in (args.size or ["64x4096", "64x16384"])]
    summary: dict[str, Any] = {"mode": "ab", "rounds": args.rounds, "threads": args.threads,
                               "max_slowdown": args.max_slowdown, "clock": args.clock,
                               "shapes": [list(s) for s in shapes], "busy": args.busy,
                               "scenarios": {}}
    with busy_process(args.busy, None):
        for name in args.scenario or list(AB_SCENARIOS):
            summary["scenarios"][name] = _ab_scenario(name, args, case, shapes)
    return summary


def _ab_scenario(name: str, args: argparse.Namespace, case: Any,
                 shapes: list[tuple[int, int]]) -> dict[str, Any]:
    """`trials` gates of one examples/ab pair, each with a fresh seed."""
    trials = args.accuracy_trials if "error" in name else args.trials
    pairs = versions_from_files(str(AB / "base.py"), str(AB / AB_SCENARIOS[name]))
    numerics = None
    outcomes = []
    t0, load0 = time.perf_counter(), os.getloadavg()
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
    return _tally(name, outcomes, t0, load0)


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


def case_kernels(case: Path) -> list[str]:
    """The kernels `elasticbench run --case CASE` times (its baseline aside)."""
    c = load_run_case(case)
    chosen = choose_kernels(list(c.functions), list(c.backends), list(c.kernels), [], c.mode)
    return [k.name for k in chosen if k.name not in c.exclude and k.name != c.baseline]


def _run(out: Path, args: argparse.Namespace, case: Path, kernel_file: Path | None,
         only: list[str] | None = None) -> None:
    cmd = [sys.executable, "-m", "elasticbench", "run", "--case", str(case),
           "--processes", str(args.processes), "--json", str(out)]
    for size in args.size or []:
        cmd += ["--size", size]
    if kernel_file is not None:
        cmd += ["--kernel-file", str(kernel_file)]
    if only:
        cmd += ["--only", ",".join(only)]
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
    return gate_outcome(json.loads(out.read_text()), os.getloadavg()[0])


def gate_outcome(doc: dict[str, Any], load: float) -> dict[str, Any]:
    """What a pair's `gate --json` document says, for the tally."""
    rows = [r for r in doc["rows"] if r["estimate"]]
    return {"failed": doc["failed"], "load": load,
            "timing_regressions": sum(r["regression"] for r in doc["rows"]),
            "regressed": [f"{r['kernel']} {r['case']}" for r in doc["rows"] if r["regression"]],
            "numerics_regressions": sum(n["regression"] for n in doc["numerics"]),
            "cases": [f"{r['kernel']} {r['case']}" for r in rows],
            "ratios": [round(r["estimate"]["ratio"], 4) for r in rows],
            "lo": [round(r["estimate"]["lo"], 4) for r in rows],
            "noise_sd_log": [r["estimate"]["noise_sd_log"] for r in rows],
            "noise_run_sd_log": [r["estimate"].get("noise_run_sd_log") for r in rows],
            "verdicts": [r["verdict"] for r in doc["rows"]]}


def _toml_table(prefix: str, table: dict[str, Any]) -> list[str]:
    """[prefix] with its plain keys, then its sub-tables (values: strings, numbers, lists)."""
    lines = [f"[{prefix}]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()
                               if not isinstance(v, dict)]
    for k, v in table.items():
        if isinstance(v, dict):
            lines += _toml_table(f"{prefix}.{k}", v)
    return lines


def derived_case(case: Path, directory: Path, name: str, **run: Any) -> Path:
    """A copy of the case file with these [run] keys replaced (timing keys merge into
    [run.timing]; a value None removes its key)."""
    table = read_toml(case)["run"]
    table["timing"] = {**table.get("timing", {}), **run.pop("timing", {})}
    for key, value in run.items():
        table.pop(key, None)
        if value is not None:
            table[key] = value
    path = directory / f"{name}.toml"
    path.write_text("\n".join(_toml_table("run", table)) + "\n")
    return path


def _measured_case(args: argparse.Namespace, case: Path, directory: Path) -> Path:
    """The case as given, or with --threads and --budget applied."""
    run: dict[str, Any] = {}
    if args.threads is not None:
        run["threads"] = args.threads
    if args.budget is not None:
        run["timing"] = {"budget_s": args.budget}
    return derived_case(case, directory, "measured", **run) if run else case


def _planted_case(case: Path, directory: Path) -> Path:
    """The case's shapes and timing for the examples/ab kernel alone, on one thread (the
    planted busy wait burns a share of process CPU time: a share of wall time only on one
    thread)."""
    return derived_case(case, directory, "planted", functions=["elastic"], kernels=None,
                        backends=None, exclude=None, threads=1, verify_inputs=["normal"])


def runs(args: argparse.Namespace) -> dict[str, Any]:
    case = Path(args.case) if args.case else builtin_case("default")
    summary: dict[str, Any] = {"mode": "runs", "case": str(case), "processes": args.processes,
                               "sizes": args.size, "only": args.only, "threads": args.threads,
                               "budget_s": args.budget, "busy": args.busy, "cpus": args.cpus,
                               "against_baseline": args.against_baseline, "scenarios": {}}
    with tempfile.TemporaryDirectory(prefix="gate-power-") as tmp, \
            busy_process(args.busy, args.cpus.split(",")[-1] if args.cpus else None):
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        measured = _measured_case(args, case, work)
        aa_only = args.only.split(",") if args.only else None
        for name in args.scenario or list(RUN_SCENARIOS):
            planted = name != "A/A"
            run_case = _planted_case(measured, work) if planted else measured
            # "25% slower + A/A": the planted kernel timed with the case's own kernels, which
            # are the same code on both sides: one pass measures both targets
            only = ([PLANTED, *(aa_only or case_kernels(measured))] if name.endswith("A/A")
                    and planted else None if planted else aa_only)
            files = (AB / "base.py", AB / "slow25.py") if planted else (None, None)
            outcomes = []
            t0, load0 = time.perf_counter(), os.getloadavg()
            pairs = (_pairs_against_baseline if args.against_baseline else _pairs)(
                args, work, run_case, files, only, "planted" if planted else "aa")
            for pair, (base, current) in enumerate(pairs):
                outcomes.append(_gate(base, current, work / f"cmp{pair}.json"))
                summary["scenarios"][name] = _tally(name, outcomes, t0, load0, quiet=True)
                _save(args.out, summary | {"partial": True})  # a stopped measurement keeps it
                _print(name, pair, outcomes[-1])
            summary["scenarios"][name] = _tally(name, outcomes, t0, load0)
    return summary


def _pairs(args: argparse.Namespace, work: Path, case: Path, files: tuple, only, tag: str):
    """(base, current) run files, two fresh runs a pair, their order alternating."""
    for pair in range(args.pairs):
        a, b = work / f"{tag}{pair}a.json", work / f"{tag}{pair}b.json"
        order = [(a, files[0]), (b, files[1])]
        for out, kernel_file in order if pair % 2 == 0 else order[::-1]:
            _run(out, args, case, kernel_file, only)
        yield a, b


def _pairs_against_baseline(args: argparse.Namespace, work: Path, case: Path, files: tuple,
                            only, tag: str):
    """(baseline, current): as a CI job against a baseline saved from K runs. The base runs
    and the current runs alternate; pair i gates current run i against a baseline saved
    (`elasticbench baseline save`) from base runs i..i+K-1, the window around it in time, so
    each pair has its own baseline (consecutive ones share K-1 runs)."""
    k = args.against_baseline
    base_runs: list[Path] = []

    def base_run() -> None:
        base_runs.append(work / f"{tag}base{len(base_runs)}.json")
        _run(base_runs[-1], args, case, files[0], only)

    for _ in range(k - 1):
        base_run()
    for pair in range(args.pairs):
        current = work / f"{tag}current{pair}.json"
        _run(current, args, case, files[1], only)
        base_run()
        name = f"{tag}baseline{pair}"
        proc = subprocess.run([sys.executable, "-m", "elasticbench", "baseline", "save",
                               *map(str, base_runs[pair:pair + k]), "--dir", str(work),
                               "--name", name, "--force"], capture_output=True, text=True,
                              cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"baseline save failed: {proc.stderr.strip()}")
        yield work / f"{name}.json", current


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


def _save(path: Path | None, summary: dict[str, Any]) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1) + "\n")


def _tally(name: str, outcomes: list[dict[str, Any]], t0: float,
           load0: tuple[float, float, float], quiet: bool = False) -> dict[str, Any]:
    failed = sum(o["failed"] for o in outcomes)
    out = {"trials": len(outcomes), "gates_failed": failed,
           "seconds": round(time.perf_counter() - t0, 1),
           "load_start": [round(v, 2) for v in load0],
           "load_end": [round(v, 2) for v in os.getloadavg()], "outcomes": outcomes}
    line = f"== {name}: gate failed {failed}/{len(outcomes)}"
    if "regressed" in outcomes[0]:  # runs: which kernel made it fail
        planted = sum(any(c.startswith(f"{PLANTED} ") for c in o["regressed"])
                      for o in outcomes)
        others = sum(any(not c.startswith(f"{PLANTED} ") for c in o["regressed"])
                     or o["numerics_regressions"] > 0 for o in outcomes)
        out |= {"planted_caught": planted, "other_false_alarms": others}
        line += f"; the planted kernel caught {planted}, another kernel flagged {others}"
    if not quiet:
        print(line, flush=True)
    return out


def targets(args: argparse.Namespace) -> dict[str, Any]:
    """Issue 15's three targets, without and with a second busy process: one `ab` and one
    `runs` measurement per condition, each written to OUT_DIR as it finishes, then the table."""
    out_dir: Path = args.out_dir
    for cond in args.condition or ["idle", "busy"]:
        busy = ["--busy"] if cond == "busy" else []
        measure(["ab", "--scenario", "A/A", "--scenario", "10% slower", "--trials",
                 str(args.trials), "--max-slowdown", args.ab_max_slowdown,
                 "--clock", args.ab_clock, *busy,
                 "--out", str(out_dir / f"ab-{cond}.json")])
        scenarios = (["--scenario", "25% slower + A/A"] if args.combined
                     else ["--scenario", "A/A", "--scenario", "25% slower"])
        shapes = [a for size in args.size or [] for a in ("--size", size)]
        budget = ["--budget", str(args.budget)] if args.budget else []
        measure(["runs", *scenarios, "--pairs", str(args.pairs), "--processes",
                 str(args.processes), *shapes, *budget, *busy,
                 "--against-baseline", str(args.against_baseline),
                 "--out", str(out_dir / f"runs-{cond}.json")])
    return table(argparse.Namespace(out_dir=out_dir))


def table(args: argparse.Namespace) -> dict[str, Any]:
    """The targets table (Markdown) from the ab-*.json and runs-*.json of OUT_DIR."""
    rows = ["| target | condition | load 1/5/15 min, start -> end | measured | issue's bound |",
            "|---|---|---|---|---|"]

    def load(s: dict[str, Any]) -> str:
        return (f"{'/'.join(f'{v:.1f}' for v in s['load_start'])} -> "
                f"{'/'.join(f'{v:.1f}' for v in s['load_end'])}")

    order = {"runs-idle": 0, "runs-busy": 1, "ab-idle": 2, "ab-busy": 3}  # the order
    for path in sorted(args.out_dir.glob("*-*.json"), key=lambda p: order.get(p.stem, 4)):
        doc = json.loads(path.read_text())
        cond = ("a second busy process" if doc.get("busy") else "no extra load") + (
            " (stopped early)" if doc.get("partial") else "")
        sc = doc.get("scenarios", {})
        if doc.get("mode") == "ab":
            how = (f"`ab`, --clock {doc.get('clock', 'wall')}, "
                   f"--max-slowdown {doc['max_slowdown']}, {doc['threads']} thread, "
                   f"{doc['rounds']} rounds, {', '.join('x'.join(map(str, s)) for s in doc['shapes'])}")
            if "A/A" in sc:
                s = sc["A/A"]
                rows.append(f"| A/A false alarms ({how}) | {cond} | {load(s)} | "
                            f"{s['gates_failed']}/{s['trials']} | <= 1/20 |")
            if "10% slower" in sc:
                s = sc["10% slower"]
                rows.append(f"| 10% slowdown caught ({how}) | {cond} | {load(s)} | "
                            f"{s['gates_failed']}/{s['trials']} | >= 19/20 |")
        elif doc.get("mode") == "runs":
            sizes = ", ".join(doc.get("sizes") or ["the case's sizes"])
            how = (f"{doc['processes']} processes per run, {sizes}"
                   + (f", against baselines of {doc['against_baseline']} runs"
                      if doc.get("against_baseline") else "")
                   + (f", budget {doc['budget_s']} s" if doc.get("budget_s") else "")
                   + (f", {doc['threads']} thread(s)" if doc.get("threads") is not None else ""))
            for name, s in sc.items():
                cases = s["outcomes"][0]["cases"] if s["outcomes"] else []
                others = sum(not c.startswith(f"{PLANTED} ") for c in cases)
                if name == "A/A":
                    rows.append(f"| A/A across processes, {others} cases ({how}) | {cond} | "
                                f"{load(s)} | {s['gates_failed']}/{s['trials']} pairs failed"
                                f" | <= 1/20 |")
                    continue
                rows.append(f"| 25% slowdown across processes caught ({how}, 1 thread) | "
                            f"{cond} | {load(s)} | {s['planted_caught']}/{s['trials']} | "
                            f">= 19/20 |")
                if name.endswith("A/A"):
                    rows.append(f"| A/A across processes: the other {others} cases of "
                                f"those pairs ({how}, 1 thread) | {cond} | {load(s)} | "
                                f"{s['other_false_alarms']}/{s['trials']} pairs with a false "
                                f"alarm | <= 1/20 |")
    text = "\n".join(rows) + "\n"
    print(text)
    (args.out_dir / "targets.md").write_text(text)
    return {"mode": "table", "markdown": text}


def parser() -> argparse.ArgumentParser:
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
    p.add_argument("--busy", action="store_true", help="a second busy process throughout")
    p = sub.add_parser("runs", help="gate on separate runs")
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--case", default=None, help="case file [the default case]")
    p.add_argument("--size", action="append", default=None,
                   help="ROWSxN instead of the case's sizes (repeatable)")
    p.add_argument("--only", default=None, help="only these kernels (A/A), comma-separated")
    p.add_argument("--threads", type=int, default=None, help="instead of the case's threads")
    p.add_argument("--budget", type=float, default=None,
                   help="instead of the case's run.timing.budget_s (seconds per cell)")
    p.add_argument("--scenario", action="append", choices=list(RUN_SCENARIOS), default=None)
    p.add_argument("--busy", action="store_true", help="a second busy process throughout")
    p.add_argument("--cpus", default=None, help="pin to these CPUs, e.g. 0,1")
    p.add_argument("--keep", default=None, help="keep the run files in this folder")
    p.add_argument("--against-baseline", type=int, default=0, metavar="K",
                   help="gate each current run against a baseline saved from K base runs")
    p = sub.add_parser("simulate", help="the interval methods on synthetic processes")
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--between", type=float, default=0.10, help="sd of log process medians")
    p.add_argument("--within", type=float, default=0.03, help="sd of log samples")
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    for p in sub.choices.values():
        p.add_argument("--out", type=Path, default=None)
    p = sub.add_parser("targets", help="issue 15's targets, idle and busy, then the table")
    p.add_argument("--out-dir", type=Path, default=ROOT / "results" / "gate_power")
    p.add_argument("--condition", action="append", choices=["idle", "busy"], default=None)
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--ab-max-slowdown", default="5%",
                   help="ab's threshold: below 10%%, or a 10%% slowdown cannot fail it")
    p.add_argument("--ab-clock", choices=["wall", "cpu"], default="wall")
    p.add_argument("--processes", type=int, default=3, help="per run, so per side")
    p.add_argument("--combined", action="store_true",
                   help="one runs pass: the planted kernel with the case's kernels (1 thread)")
    p.add_argument("--size", action="append", default=None, help="ROWSxN for the runs")
    p.add_argument("--budget", type=float, default=None, help="run.timing.budget_s")
    p.add_argument("--against-baseline", type=int, default=0, metavar="K",
                   help="runs: gate against baselines saved from K runs (0: run against run)")
    p.add_argument("--out", type=Path, default=None)
    p = sub.add_parser("table", help="the targets table from a folder of measurements")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--out", type=Path, default=None)
    return ap


def measure(argv: list[str]) -> dict[str, Any]:
    """Run one mode as its command line would; write --out; print the scenario lines."""
    args = parser().parse_args(argv)
    start = os.getloadavg()
    modes = {"ab": ab, "runs": runs, "simulate": simulate, "targets": targets, "table": table}
    summary = modes[args.mode](args)
    summary["machine_load_start"], summary["machine_load_end"] = start, os.getloadavg()
    _save(args.out, summary)
    for name, s in summary.get("scenarios", {}).items():
        extra = (f" (planted kernel caught {s['planted_caught']}, another kernel flagged "
                 f"{s['other_false_alarms']})" if "planted_caught" in s else "")
        print(f"{name:>20}: gate failed {s['gates_failed']}/{s['trials']}{extra}")
    return summary


def main() -> None:
    measure(sys.argv[1:])


if __name__ == "__main__":
    main()
