"""The gates on a CUDA GPU: how often `ab` flags identical code (A/A), and how often it
catches a planted 10% slowdown, 20 trials each, as docs/gates.md measures them on the CPU:

    python3 scripts/gpu_gates.py --json results/gpu/gates.json [--trials 20] [--budget 90]

The kernel is the Triton row kernel `triton_elastic`, fp32, at 4096x4096 and 1024x16384
(64 MiB each, out of an H100's L2: flushed before each sample; tens of microseconds, so that
10% of it is more than launching one more kernel costs), timed by `elasticbench ab`'s own
code (gate/ab.py: interleaved rounds, CUDA events) and gated at ab's settings of the CPU
figures: 40 rounds, --max-slowdown 5%, alpha 0.01. A/A pairs the kernel with itself under two
names. The planted version runs the kernel, then a device-side spin (torch.cuda._sleep) of
10% of the kernel's own median time at that shape, calibrated in this run with the same
clock: the spin's cycles per nanosecond, the kernel's time, and what launching one more (empty)
spin adds, so the planted slowdown is 10% of device time on any GPU (its measured size is in
the JSON). A/A and planted trials alternate, each with its own seed, so that drift reaches
both. The JSON is rewritten after every trial, so a run cut off by --budget keeps its trials.
Without a CUDA GPU it prints one line and exits 0 (scripts/gpu_checks.sh runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "triton_elastic"
SHAPES = ((4096, 4096), (1024, 16384))
DTYPE = "fp32"
PLANTED = 0.10  # the planted slowdown, a share of the kernel's device time
MAX_SLOWDOWN = 0.05  # the gate's threshold: below the planted 10% (docs/gates.md, `ab`)
ALPHA = 0.01
SPIN_CYCLES = 2_000_000  # the calibration spin: about a millisecond
SCENARIOS = ("A/A", "10% slower")


def cycles_for(base_ns: float, launch_ns: float, ns_per_cycle: float,
               factor: float = PLANTED) -> int:
    """Spin cycles that add factor x base_ns of device time to a call, given that launching
    the spin costs launch_ns by itself; ValueError where the launch alone exceeds that."""
    if not (base_ns > 0 and ns_per_cycle > 0):
        raise ValueError(f"need a positive kernel time and spin rate, got {base_ns}, "
                         f"{ns_per_cycle}")
    want = factor * base_ns - max(0.0, launch_ns)
    if want < 0:
        raise ValueError(f"an empty spin's launch ({launch_ns:.0f} ns) already costs more "
                         f"than {factor:.0%} of the kernel's {base_ns:.0f} ns: "
                         "choose a larger shape")
    return round(want / ns_per_cycle)


def planted(fn: Callable[..., Any], cycles: Mapping[tuple[int, ...], int],
            spin: Callable[[int], None]) -> Callable[..., Any]:
    """fn, followed on the device by a spin of cycles[x.shape] (KeyError on another shape)."""
    def slowed(x: Any, **params: Any) -> Any:
        y = fn(x, **params)
        spin(cycles[tuple(x.shape)])
        return y
    slowed.__doc__ = f"{fn.__doc__ or fn.__name__} (planted: a spin after each call)"
    return slowed


def outcome(cmp: Any) -> dict[str, Any]:
    """One gated trial: failed, and each case's ratio, interval and verdict."""
    rows = [r for r in cmp.rows if r.est is not None]
    return {"failed": bool(cmp.failed), "cases": [r.case for r in rows],
            "ratios": [round(r.est.ratio, 4) for r in rows],
            "lo": [round(r.est.lo, 4) for r in rows], "hi": [round(r.est.hi, 4) for r in rows],
            "verdicts": [r.verdict for r in cmp.rows]}


def summarize(trials: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The figures of docs/gates.md: A/A gates failed (false alarms) and planted slowdowns
    caught (gates failed), each out of its trials."""
    aa, slow = trials.get("A/A", []), trials.get("10% slower", [])
    return {"aa_false_alarms": sum(t["failed"] for t in aa), "aa_trials": len(aa),
            "planted_caught": sum(t["failed"] for t in slow), "planted_trials": len(slow)}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def calibrate(spec: Any, case: Any, policy: Any, torch: Any) -> dict[str, Any]:
    """The spin's rate, and per shape the kernel's median time and an empty spin's cost, all
    with ab's own clock and timing (gate/ab.py time_pair)."""
    import numpy as np

    from elasticbench.harness.backends import get_backend
    from elasticbench.harness.bench.runner import params_for
    from elasticbench.harness.gate.ab import Pair, time_pair
    from elasticbench.harness.inputs import generate

    clock = get_backend(spec.backend).clock()
    spans: dict[int, list[float]] = {0: [], SPIN_CYCLES: []}
    for _ in range(7):
        for cycles in spans:
            clock.start()
            torch.cuda._sleep(cycles)
            spans[cycles].append(clock.stop())
    ns_per_cycle = (_median(spans[SPIN_CYCLES]) - _median(spans[0])) / SPIN_CYCLES
    empty = replace(spec, name=f"{KERNEL}@spin0",
                    fn=planted(spec.fn, {s: 0 for s in SHAPES}, torch.cuda._sleep))
    params = params_for(case, spec.function)
    rng = np.random.default_rng(0)
    shapes: dict[str, dict[str, float]] = {}
    cycles: dict[tuple[int, ...], int] = {}
    for shape in SHAPES:
        x = generate(case.generator, DTYPE, shape, case.seed)
        samples = time_pair(Pair(KERNEL, spec, empty), x, params, policy, rng)
        base_ns = _median(samples["base"])
        launch_ns = _median(samples["current"]) - base_ns
        name = f"{shape[0]}x{shape[1]}"
        shapes[name] = {"kernel_ns": base_ns, "empty_spin_ns": launch_ns}
        try:
            cycles[shape] = shapes[name]["cycles"] = cycles_for(base_ns, launch_ns,
                                                                 ns_per_cycle)
        except ValueError as e:  # too short a kernel on this GPU: left out, and said so
            shapes[name]["left_out"] = str(e)
    if not cycles:
        raise SystemExit(f"gpu_gates: no shape can carry a planted {PLANTED:.0%}: {shapes}")
    return {"ns_per_cycle": ns_per_cycle, "shapes": shapes, "cycles": cycles}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Calibrate, then alternate A/A and planted trials until done or out of time."""
    import torch

    from elasticbench.harness.bench.cases import load_run_case
    from elasticbench.harness.environment import describe
    from elasticbench.harness.gate.ab import ABPolicy, Pair, run_ab
    from elasticbench.harness.gate.compare import compare
    from elasticbench.harness.registry import get_kernel

    t0 = time.monotonic()
    spec = get_kernel(KERNEL)
    case = load_run_case(ROOT / "cases" / "gpu.toml")
    policy = ABPolicy(rounds=args.rounds)
    cal = calibrate(spec, case, replace(policy, rounds=10), torch)
    cycles = cal.pop("cycles")
    shapes = [s for s in SHAPES if s in cycles]
    slow = replace(spec, name=f"{KERNEL}@current",
                   fn=planted(spec.fn, cycles, torch.cuda._sleep))
    pairs = {"A/A": Pair(KERNEL, replace(spec, name=f"{KERNEL}@base"),
                         replace(spec, name=f"{KERNEL}@current")),
             "10% slower": Pair(KERNEL, replace(spec, name=f"{KERNEL}@base"), slow)}
    doc: dict[str, Any] = {
        "kernel": KERNEL, "dtype": DTYPE, "shapes": [list(s) for s in shapes],
        "rounds": args.rounds, "max_slowdown": MAX_SLOWDOWN, "alpha": ALPHA,
        "planted": PLANTED, "calibration": cal, "machine": describe()["machine"],
        "trials": {name: [] for name in SCENARIOS}, "complete": False}
    each: list[float] = []
    for trial in range(args.trials):
        for name in SCENARIOS:
            left = args.budget - (time.monotonic() - t0)
            if each and left < 1.5 * max(each):
                doc["stopped"] = f"out of time after {trial} trials ({left:.0f} s left)"
                return _finish(doc, args.json)
            start = time.monotonic()
            res = run_ab([pairs[name]], case, [DTYPE], shapes,
                         replace(policy, seed=trial), verify=False)
            cmp = compare(res.base, res.current, alpha=ALPHA, max_slowdown=MAX_SLOWDOWN,
                          paired=True)
            doc["trials"][name].append(outcome(cmp))
            each.append(time.monotonic() - start)
            _save(doc, args.json)
    doc["complete"] = True
    return _finish(doc, args.json)


def _save(doc: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")


def _finish(doc: dict[str, Any], path: Path | None) -> dict[str, Any]:
    doc["summary"] = summarize(doc["trials"])
    _save(doc, path)
    s = doc["summary"]
    print(f"gpu_gates: A/A false alarms {s['aa_false_alarms']}/{s['aa_trials']}, planted "
          f"{PLANTED:.0%} slowdown caught {s['planted_caught']}/{s['planted_trials']} "
          f"(ab, {KERNEL} {DTYPE}, --max-slowdown {MAX_SLOWDOWN:.0%})"
          + (f"; {doc['stopped']}" if "stopped" in doc else ""), flush=True)
    return doc


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None, help="results file (rewritten per trial)")
    p.add_argument("--trials", type=int, default=20, help="trials of each scenario [20]")
    p.add_argument("--rounds", type=int, default=40, help="ab's rounds per trial [40]")
    p.add_argument("--budget", type=float, default=90.0,
                   help="seconds: no trial starts that would not end within it [90]")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.trials < 1 or args.rounds < 5 or args.budget <= 0:
        parser().error("--trials >= 1, --rounds >= 5 and --budget > 0 required")
    try:
        import torch
    except ImportError:
        print("gpu_gates: skipped: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("gpu_gates: skipped: no CUDA GPU here (the gates' GPU figures need one)")
        return 0
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
