"""The gate's statistics on synthetic samples with known answers (seeded; no timing)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elasticbench.gate.compare import judge, parse_fraction
from elasticbench.gate.stats import (
    RatioEstimate,
    geomean,
    min_p_paired,
    min_p_unpaired,
    ratio_bootstrap,
    ratio_paired,
    ratio_unpaired,
)


def lognormal(seed: int, n: int = 30, scale: float = 1.0, sigma: float = 0.05) -> np.ndarray:
    return scale * np.random.default_rng(seed).lognormal(np.log(1e-3), sigma, n)


def test_a_25_percent_shift_is_detected_and_estimated():
    est = ratio_unpaired(lognormal(1), lognormal(2, scale=1.25))
    assert est.p < 1e-6
    assert est.lo < 1.25 < est.hi
    assert 1.18 < est.ratio < 1.32 and est.lo > 1.10
    verdict, regression, _ = judge(est, 0.01, 0.10)
    assert verdict == "slower" and regression


def test_identical_distributions_are_not_flagged():
    flagged = 0
    for seed in range(50):
        est = ratio_unpaired(lognormal(100 + seed), lognormal(200 + seed))
        flagged += judge(est, 0.01, 0.10)[1]
        assert est.lo < 1.10
    assert flagged == 0


def test_a_5_percent_shift_is_significant_but_not_a_regression_at_10_percent():
    est = ratio_unpaired(lognormal(3, n=200), lognormal(4, n=200, scale=1.05))
    verdict, regression, _ = judge(est, 0.01, 0.10)
    assert verdict == "slower" and not regression
    assert est.lo < 1.05 < est.hi


def test_a_faster_current_is_faster():
    est = ratio_unpaired(lognormal(5), lognormal(6, scale=0.7))
    assert judge(est, 0.01, 0.10)[0] == "faster" and est.hi < 1


def test_the_ci_covers_the_true_ratio_about_95_percent_of_the_time():
    covered = sum(
        (lambda e: e.lo <= 1.2 <= e.hi)(ratio_unpaired(lognormal(s, n=20),
                                                      lognormal(s + 1000, n=20, scale=1.2)))
        for s in range(200))
    assert 180 <= covered <= 200


def test_paired_rounds_see_through_drifting_load():
    rng = np.random.default_rng(7)
    load = rng.choice([1.0, 1.6, 3.0], size=40)  # per-round slowdown hitting both sides
    a = 1e-3 * load * rng.lognormal(0, 0.02, 40)
    b = 1.25e-3 * load * rng.lognormal(0, 0.02, 40)
    paired = ratio_paired(a, b)
    unpaired = ratio_unpaired(a, b)
    assert paired.lo > 1.2 and paired.hi < 1.3 and paired.p < 1e-6
    assert (paired.hi - paired.lo) < (unpaired.hi - unpaired.lo) / 2
    assert paired.p < unpaired.p / 1e6


def test_paired_identical_is_ratio_one():
    a = lognormal(8)
    est = ratio_paired(a, a.copy())
    assert est.ratio == 1.0 and est.p == 1.0
    assert judge(est, 0.01, 0.10)[0] == "same"


def test_bootstrap_is_seeded_and_agrees():
    a, b = lognormal(9), lognormal(10, scale=1.25)
    e1, e2 = ratio_bootstrap(a, b), ratio_bootstrap(a, b)
    assert (e1.lo, e1.hi) == (e2.lo, e2.hi)
    assert e1.lo < 1.25 < e1.hi and e1.lo > 1.1


def test_too_few_samples_are_not_comparable():
    assert min_p_unpaired(3, 3) == pytest.approx(0.1)
    assert min_p_unpaired(5, 5) == pytest.approx(2 / 252)
    assert min_p_paired(5) == pytest.approx(1 / 16)
    est = ratio_unpaired([1.0, 1.1, 1.05], [2.0, 2.1, 2.2])
    verdict, regression, reason = judge(est, 0.01, 0.10)
    assert verdict == "not comparable" and not regression and "cannot reach" in reason


def test_judge_rules():
    def est(ratio, lo, hi, p):
        return RatioEstimate(ratio, lo, hi, p, 30, 30, "x", 1e-10)

    assert judge(est(1.3, 1.2, 1.4, 1e-5), 0.01, 0.1)[:2] == ("slower", True)
    assert judge(est(1.3, 1.05, 1.6, 1e-5), 0.01, 0.1)[:2] == ("slower", False)  # CI in band
    assert judge(est(1.3, 1.2, 1.4, 0.02), 0.01, 0.1)[:2] == ("same", False)  # not significant
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
        ratio_unpaired([1.0, -1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        ratio_paired([1.0, 2.0], [1.0])
