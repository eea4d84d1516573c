"""The gate's statistics on synthetic samples with known answers (seeded; no timing)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elasticbench.harness.gate.compare import judge, parse_fraction
from elasticbench.harness.gate.stats import (
    NoiseFloor,
    RatioEstimate,
    geomean,
    min_p_paired,
    noise_floor,
    noise_floor_of_runs,
    ratio_hierarchical_bootstrap,
    ratio_paired,
    ratio_processes,
)


def lognormal(seed: int, n: int = 30, scale: float = 1.0, sigma: float = 0.05) -> np.ndarray:
    return scale * np.random.default_rng(seed).lognormal(np.log(1e-3), sigma, n)


def processes(seed: int, k: int, scale: float = 1.0, between: float = 0.05,
              within: float = 0.01, n: int = 20) -> list[np.ndarray]:
    """k processes: each its own level (spread `between`), samples tight around it."""
    rng = np.random.default_rng(seed)
    return [scale * 1e-3 * np.exp(rng.normal(0, between) + rng.normal(0, within, n))
            for _ in range(k)]


def test_a_25_percent_shift_across_processes_is_detected_and_estimated():
    est = ratio_processes(processes(1, 5), processes(2, 5, scale=1.25, between=0.03))
    assert est.p < 1e-3 and est.processes == (5, 5) and est.noise is not None
    assert est.lo < 1.25 < est.hi and est.lo > 1.10
    verdict, regression, _ = judge(est, 0.01, 0.10)
    assert verdict == "slower" and regression


def test_between_process_spread_is_not_a_regression():
    # Samples agree within a process (1%) while processes differ by 15%: a test on samples
    # would be sure of a difference; over processes there is none to see.
    flagged = slower = 0
    for seed in range(200):
        est = ratio_processes(processes(seed, 3, between=0.15),
                              processes(1000 + seed, 3, between=0.15))
        flagged += judge(est, 0.01, 0.10)[1]
        slower += judge(est, 0.01, 0.10)[0] == "slower"
    assert flagged <= 3 and slower <= 3  # alpha 0.01, two-sided: about 1 in 200 expected


def test_the_t_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    covered = sum(
        (lambda e: e.lo <= 1.2 <= e.hi)(ratio_processes(processes(s, 4, between=0.08),
                                                        processes(s + 500, 4, 1.2, 0.08)))
        for s in range(300))
    assert 270 <= covered <= 300  # 285 expected


def test_one_process_per_side_is_inconclusive_without_a_noise_floor():
    est = ratio_processes([lognormal(1)], [lognormal(2, scale=1.5)])
    assert est.inconclusive and "noise floor" in est.inconclusive
    assert 1.4 < est.ratio < 1.6 and math.isnan(est.lo)
    verdict, regression, reason = judge(est, 0.01, 0.10)
    assert verdict == "inconclusive" and not regression and "processes" in reason


def test_a_noise_floor_judges_one_process_and_is_never_undercut():
    floor = NoiseFloor(0.02, 8)
    est = ratio_processes([lognormal(1, sigma=0.01)], [lognormal(2, sigma=0.01, scale=1.5)],
                          floors=[floor])
    assert est.noise == floor and est.lo > 1.3 and judge(est, 0.01, 0.1)[:2] == ("slower", True)
    # processes that happen to agree closely do not shrink the interval below the floor
    tight = ratio_processes(processes(3, 3, between=0.001), processes(4, 3, 1.05, 0.001),
                            floors=[NoiseFloor(0.1, 4)])
    assert tight.noise == NoiseFloor(0.1, 6) and tight.lo < 1 < tight.hi
    # current processes more spread than the floor widen it; their degrees of freedom add up
    wide = ratio_processes(processes(5, 3, between=0.2), processes(6, 3, between=0.2),
                           floors=[NoiseFloor(0.001, 10)])
    assert wide.noise is not None and wide.noise.sd_log > 0.05 and wide.noise.df == 12


def test_noise_floor_of_processes():
    assert noise_floor([lognormal(1)]) is None
    f = noise_floor(processes(9, 10, between=0.1))
    assert f is not None and f.df == 9 and 0.05 < f.sd_log < 0.16
    assert f.percent == pytest.approx(100 * math.expm1(f.sd_log))


def runs(seed: int, r: int, k: int, shift: float, scale: float = 1.0,
         between: float = 0.01) -> list[list[np.ndarray]]:
    """r runs of k processes each; every process of a run shares that run's shift."""
    rng = np.random.default_rng(seed)
    return [processes(seed * 100 + i, k, scale * math.exp(rng.normal(0, shift)), between)
            for i in range(r)]


def test_noise_floor_of_runs_separates_the_shift_between_runs():
    f = noise_floor_of_runs(runs(1, 8, 4, shift=0.10, between=0.01))
    assert f is not None and f.df == 8 * 3 and f.run_df == 7
    assert 0.005 < f.sd_log < 0.02 and 0.05 < f.run_sd_log < 0.2
    # no shift beyond what the processes explain: the runs' level is 0
    quiet = noise_floor_of_runs([processes(s, 4, between=0.05) for s in range(6)])
    assert quiet is not None and quiet.run_df in (0, 5) and quiet.run_sd_log < 0.04
    # one process a run: the levels cannot be told apart, the whole spread is the processes'
    one = noise_floor_of_runs([processes(s, 1, between=0.05) for s in range(5)])
    assert one is not None and one.df == 4 and one.run_sd_log == 0
    assert noise_floor_of_runs([processes(1, 1)]) is None


def test_a_shift_between_runs_is_not_a_regression_against_a_floor_that_knows_it():
    # Two runs of 3 processes each, identical code, but each run shifted as a whole by ~10%
    # (what the processes of one run share): the processes agree, so without the floor's
    # run level the gate would flag many; with a floor from 5 earlier runs it stays quiet.
    blind = aware = 0
    for seed in range(200):
        history = runs(seed, 5, 3, shift=0.10)
        floor = noise_floor_of_runs(history)
        a, b = runs(10_000 + seed, 2, 3, shift=0.10)
        blind += judge(ratio_processes(a, b), 0.01, 0.10)[1]
        aware += judge(ratio_processes(a, b, floors=[floor]), 0.01, 0.10)[1]
    assert blind > 30 and aware <= 4
    # and a real 40% slowdown still shows through the floor
    history = runs(7, 5, 3, shift=0.02)
    a, b = runs(8, 1, 3, shift=0.02)[0], runs(9, 1, 3, shift=0.02, scale=1.4)[0]
    est = ratio_processes(a, b, floors=[noise_floor_of_runs(history)])
    assert judge(est, 0.01, 0.10)[:2] == ("slower", True) and est.lo < 1.4 < est.hi


def test_hierarchical_bootstrap_is_seeded_and_agrees():
    a, b = processes(9, 5, between=0.03), processes(10, 5, scale=1.25, between=0.03)
    e1, e2 = ratio_hierarchical_bootstrap(a, b), ratio_hierarchical_bootstrap(a, b)
    assert (e1.lo, e1.hi) == (e2.lo, e2.hi)
    assert e1.lo < 1.25 < e1.hi and e1.lo > 1.1 and e1.p < 0.01
    one = ratio_hierarchical_bootstrap([lognormal(1)], b)
    assert judge(one, 0.01, 0.1)[0] == "inconclusive"


def test_paired_rounds_see_through_drifting_load():
    rng = np.random.default_rng(7)
    load = rng.choice([1.0, 1.6, 3.0], size=40)  # per-round slowdown hitting both sides
    a = 1e-3 * load * rng.lognormal(0, 0.02, 40)
    b = 1.25e-3 * load * rng.lognormal(0, 0.02, 40)
    paired = ratio_paired(a, b)
    assert paired.lo > 1.2 and paired.hi < 1.3 and paired.p < 1e-6


def test_paired_identical_is_ratio_one():
    a = lognormal(8)
    est = ratio_paired(a, a.copy())
    assert est.ratio == 1.0 and est.p == 1.0
    assert judge(est, 0.01, 0.10)[0] == "same"


def test_too_few_pairs_are_not_comparable():
    assert min_p_paired(5) == pytest.approx(1 / 16)
    est = ratio_paired([1.0, 1.1, 1.05], [2.0, 2.1, 2.2])
    verdict, regression, reason = judge(est, 0.01, 0.10)
    assert verdict == "not comparable" and not regression and "cannot reach" in reason


def test_judge_rules():
    def est(ratio, lo, hi, p):
        return RatioEstimate(ratio, lo, hi, p, 30, 30, "x", 1e-10)

    assert judge(est(1.3, 1.2, 1.4, 1e-5), 0.01, 0.1)[:2] == ("slower", True)
    assert judge(est(1.3, 1.05, 1.6, 1e-5), 0.01, 0.1)[:2] == ("slower", False)  # CI in band
    # the interval excludes 1, p does not reach alpha: named for what it is, never "same"
    verdict, regression, reason = judge(est(1.3, 1.2, 1.4, 0.02), 0.01, 0.1)
    assert (verdict, regression, reason) == ("not significant", False, "p 0.02 >= alpha 0.01")
    assert judge(est(0.8, 0.7, 0.95, 0.02), 0.01, 0.1)[0] == "not significant"
    assert judge(est(1.05, 0.98, 1.2, 0.2), 0.01, 0.1)[:2] == ("same", False)
    assert judge(est(0.8, 0.7, 0.9, 1e-5), 0.01, 0.1)[:2] == ("faster", False)
    assert judge(est(1.3, 1.2, 1.4, 1e-5), 0.01, 0.25)[:2] == ("slower", False)


def test_geomean_and_fractions():
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([1.1, 1.1, 1.1]) == pytest.approx(1.1)
    assert math.isnan(geomean([]))
    assert parse_fraction("10%") == pytest.approx(0.1)
    assert parse_fraction("0.25") == pytest.approx(0.25)
    assert parse_fraction("200%") == pytest.approx(2.0)
    for bad in ("10", "fast", "-5%", "inf%"):
        with pytest.raises(ValueError):
            parse_fraction(bad)


def test_samples_must_be_positive():
    with pytest.raises(ValueError):
        ratio_processes([[1.0, -1.0]], [[1.0, 2.0]])
    with pytest.raises(ValueError):
        ratio_paired([1.0, 2.0], [1.0])
