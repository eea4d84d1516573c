"""Every verdict agrees with the interval printed beside it, at any --alpha, in every output.

Synthetic comparisons (seeded draws, never timings) of every method: process t intervals,
with and without a baseline's noise floor, the hierarchical bootstrap, and paired rounds.
The check reads the interval as printed (3 decimals, more where rounding would cross 1)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_gate_cli import rec, write_run

from elasticbench.harness.gate.compare import compare_series, interval_level
from elasticbench.harness.gate.load import Series
from elasticbench.harness.gate.render import fmt_bound, fmt_ratio
from elasticbench.harness.gate.stats import NoiseFloor

ALPHAS = (1e-5, 1e-3, 0.01, 0.02, 0.05, 0.1, 0.2)
MAX_SLOWDOWN = 0.10
INTERVAL = re.compile(r"\[([0-9.]+), ([0-9.]+)\]")


def printed_bounds(text: str) -> tuple[float, float]:
    """The interval in a printed ratio cell, e.g. '1.195 [1.049, 1.361]'."""
    m = INTERVAL.search(text)
    assert m, text
    return float(m.group(1)), float(m.group(2))


def agrees(verdict: str, lo: float, hi: float, regression: bool) -> bool:
    """True when the verdict (as printed) says what the interval [lo, hi] shows."""
    if regression and not lo > 1 + MAX_SLOWDOWN:
        return False
    if verdict in ("slower", "not significant, slower"):
        return lo > 1
    if verdict in ("faster", "not significant, faster"):
        return hi < 1
    if verdict == "same":
        return lo <= 1 <= hi
    return verdict in ("inconclusive", "not comparable")


def groups(rng: np.random.Generator, k: int, shift: float, between: float, n: int = 8
           ) -> list[np.ndarray]:
    return [1e-3 * np.exp(shift + rng.normal(0, between) + rng.normal(0, 0.01, n))
            for _ in range(k)]


def series(gs: list[np.ndarray]) -> Series:
    costs = np.concatenate(gs)
    return Series(("k",), "k", "fp32 64x4096", costs, float(np.median(costs)), groups=gs)


def comparisons(count: int):
    """(kind, base, current, floors, paired, method), shifts spread around the thresholds."""
    rng = np.random.default_rng(2026)
    for i in range(count):
        shift = rng.uniform(-0.35, 0.35)
        between = rng.choice([0.01, 0.05, 0.1, 0.2])
        kind = ("t", "floor", "paired", "t", "bootstrap")[i % 5]
        if kind == "paired":
            n = int(rng.integers(6, 45))
            base = 1e-3 * np.exp(rng.normal(0, between, n))
            cur = base * np.exp(shift + rng.normal(0, between / 2, n))
            yield kind, series([base]), series([cur]), (), True, "t"
        elif kind == "floor":
            floor = NoiseFloor(between, int(rng.integers(2, 12)),
                               rng.choice([0.0, between / 2]), int(rng.integers(1, 5)))
            yield (kind, series(groups(rng, 1, 0.0, between)),
                   series(groups(rng, 1, shift, between)), (floor, None), False, "t")
        else:
            k = int(rng.integers(2, 6))
            yield (kind, series(groups(rng, k, 0.0, between)),
                   series(groups(rng, k, shift, between)), (), False,
                   "bootstrap" if kind == "bootstrap" else "t")


def test_no_verdict_contradicts_its_printed_interval_at_any_alpha():
    seen: Counter[tuple[float, str]] = Counter()
    cases = list(comparisons(100))
    for alpha in ALPHAS:
        for kind, base, cur, floors, paired, method in cases:
            row = compare_series(base, cur, alpha=alpha, max_slowdown=MAX_SLOWDOWN,
                                 paired=paired, method=method, floors=floors)
            if row.verdict == "not comparable":  # too few rounds for a tiny alpha
                continue
            assert row.est.confidence == interval_level(alpha)
            lo, hi = printed_bounds(fmt_ratio(row, MAX_SLOWDOWN))
            assert agrees(row.label, lo, hi, row.regression), (kind, alpha, row)
            if alpha >= 0.05:  # the interval is the test's own: p < alpha iff it excludes 1
                assert (row.est.p < alpha) == (row.est.lo > 1 or row.est.hi < 1), (kind, row)
            seen[(alpha, row.verdict)] += 1
    # the middle state exists only where the test is stricter than the 95% interval
    assert seen[(0.01, "not significant")] > 0 and seen[(1e-5, "not significant")] > 0
    assert all(seen[(a, "not significant")] == 0 for a in (0.05, 0.1, 0.2))
    for alpha in ALPHAS:
        assert seen[(alpha, "slower")] > 0 and seen[(alpha, "same")] > 0, alpha


def test_bounds_never_round_onto_or_across_one():
    assert fmt_bound(1.0004) == "1.0004" and fmt_bound(0.99996) == "0.99996"
    assert fmt_bound(1.2345) == "1.234" or fmt_bound(1.2345) == "1.235"
    assert fmt_bound(1.0) == "1.000" and fmt_bound(0.5) == "0.500"
    assert fmt_bound(1.10004, (1.0, 1.1)) == "1.10004" and fmt_bound(1.10004) == "1.100"


def md_rows(md: str) -> list[tuple[str, str]]:
    """(verdict mark, ratio cell) of each row of the 'All cases' table."""
    body = md.split("<summary>All cases</summary>", 1)[1]
    rows = [line.split(" | ") for line in body.splitlines() if line.startswith("| ")
            and "| kernel |" not in line]
    return [(cells[0].lstrip("| "), cells[5]) for cells in rows]


@pytest.mark.parametrize("alpha", ["1e-05", "0.01", "0.1"])
def test_gate_outputs_agree_with_their_intervals(cli, tmp_path: Path, alpha: str,
                                                 monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "250")  # the table whole, titles and headers unwrapped
    scales = [0.7, 0.85, 0.93, 1.0, 1.05, 1.1, 1.2, 1.45]
    base = write_run(tmp_path / "b.json", [rec(f"k{i}", i, procs=3, between=0.06)
                                           for i in range(len(scales))])
    cur = write_run(tmp_path / "c.json", [rec(f"k{i}", 50 + i, s, procs=3, between=0.06)
                                          for i, s in enumerate(scales)])
    r = cli("gate", str(base), str(cur), "--alpha", alpha, "--json", str(tmp_path / "g.json"),
            "--markdown", str(tmp_path / "g.md"))
    assert r.code in (0, 1), r.err
    level = f"{100 * interval_level(float(alpha)):g}%"
    assert f"ratio with its {level} interval" in r.out and f"ratio [{level} CI]" in r.out
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["confidence"] == interval_level(float(alpha))
    for row in doc["rows"]:
        e = row["estimate"]
        label = row["verdict"] + (f", {row['direction']}" if row["verdict"] == "not significant"
                                  else "")
        assert agrees(label, e["lo"], e["hi"], row["regression"]), row
        assert e["confidence"] == doc["confidence"]
    md = (tmp_path / "g.md").read_text()
    assert f"ratio [{level} CI]" in md
    marks = {"🔴": "slower", "🟢": "faster", "⚪": "same"}
    assert len(md_rows(md)) == len(scales)
    for mark, ratio in md_rows(md):
        lo, hi = printed_bounds(ratio)
        verdict = mark.split(" **")[0].removeprefix("🟡 ")
        assert agrees(marks.get(verdict, verdict), lo, hi, "regression" in mark), (mark, ratio)
