"""Statistics of a performance comparison: is B slower than A, by how much, how sure are we.

Ratios are estimated in log space, where a slowdown by a factor is a shift:

* unpaired (two runs): Mann-Whitney U for significance, and the Hodges-Lehmann estimate of
  the shift (median of all pairwise differences log b_j - log a_i) with its distribution-free
  confidence interval read off the same U distribution;
* paired (an interleaved A/B run, one A and one B sample per round): the Wilcoxon signed-rank
  test on the per-round log ratios and the median of their Walsh averages, whose interval
  comes from the signed-rank distribution. Pairing cancels load that drifts between rounds.

exp(shift) is the ratio of medians B/A when the two distributions differ by a scale factor.
A seeded percentile bootstrap of the ratio of medians is available as a cross-check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

MAX_PAIRS = 1_000_000  # cap on pairwise differences; larger samples are thinned to quantiles


@dataclass(frozen=True)
class RatioEstimate:
    """B/A as a factor: point estimate, confidence interval, two-sided p-value."""

    ratio: float
    lo: float
    hi: float
    p: float
    n_base: int
    n_current: int
    method: str
    min_p: float  # the smallest p-value these sample sizes can reach

    @property
    def resolvable(self) -> bool:
        """True when the samples are numerous enough that p could fall below 0.05."""
        return self.min_p < 0.05


def geomean(values: list[float] | np.ndarray) -> float:
    """Geometric mean of positive numbers (nan for an empty list)."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return math.nan
    return float(np.exp(np.mean(np.log(a))))


def _thin(a: np.ndarray, k: int) -> np.ndarray:
    """k evenly spaced quantiles of a (a itself when it is no longer than k)."""
    if a.size <= k:
        return a
    return np.quantile(a, (np.arange(k) + 0.5) / k)


def _clean(samples: list[float] | np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(samples, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0 or np.any(a <= 0):
        raise ValueError(f"{what}: need positive finite samples")
    return a


def min_p_unpaired(n: int, m: int) -> float:
    """The smallest two-sided Mann-Whitney p-value with n and m samples (no ties)."""
    return min(1.0, 2.0 / float(special.comb(n + m, n)))  # comb -> inf for huge n: p -> 0


def min_p_paired(n: int) -> float:
    """The smallest two-sided Wilcoxon signed-rank p-value with n pairs."""
    return min(1.0, 2.0 / 2.0**n)


def ratio_unpaired(base: list[float] | np.ndarray, current: list[float] | np.ndarray,
                   confidence: float = 0.95) -> RatioEstimate:
    """current/base from independent samples: Hodges-Lehmann ratio, its CI, Mann-Whitney p."""
    a, b = _clean(base, "base"), _clean(current, "current")
    n, m = a.size, b.size
    p = float(stats.mannwhitneyu(b, a, alternative="two-sided").pvalue)
    k_side = max(1, int(math.sqrt(MAX_PAIRS)))
    la, lb = np.log(_thin(a, k_side)), np.log(_thin(b, k_side))
    d = np.sort((lb[None, :] - la[:, None]).ravel())
    N = d.size
    na, nb = la.size, lb.size
    z = stats.norm.ppf(0.5 + confidence / 2)
    # The k-th smallest and k-th largest pairwise differences bound the shift (normal
    # approximation of the U distribution's critical value; exact enough from n = 5 up).
    k = math.floor(na * nb / 2 - z * math.sqrt(na * nb * (na + nb + 1) / 12))
    k = min(max(k, 1), (N + 1) // 2)
    shift = float(np.median(d))
    return RatioEstimate(math.exp(shift), math.exp(d[k - 1]), math.exp(d[N - k]), p, n, m,
                         "Hodges-Lehmann / Mann-Whitney U", min_p_unpaired(n, m))


def ratio_paired(base: list[float] | np.ndarray, current: list[float] | np.ndarray,
                 confidence: float = 0.95) -> RatioEstimate:
    """current/base from paired rounds: Walsh-average median ratio, its CI, Wilcoxon p."""
    a, b = _clean(base, "base"), _clean(current, "current")
    if a.size != b.size:
        raise ValueError("paired samples need as many base as current samples")
    r = np.log(b) - np.log(a)
    n = r.size
    if np.all(r == 0):
        p = 1.0
    else:
        p = float(stats.wilcoxon(r, zero_method="pratt", alternative="two-sided").pvalue)
    i, j = np.triu_indices(n)
    w = np.sort((r[i] + r[j]) / 2)
    N = w.size
    z = stats.norm.ppf(0.5 + confidence / 2)
    k = math.floor(n * (n + 1) / 4 - z * math.sqrt(n * (n + 1) * (2 * n + 1) / 24))
    k = min(max(k, 1), (N + 1) // 2)
    return RatioEstimate(math.exp(float(np.median(w))), math.exp(w[k - 1]), math.exp(w[N - k]),
                         p, n, n, "Walsh median / Wilcoxon signed-rank", min_p_paired(n))


def ratio_bootstrap(base: list[float] | np.ndarray, current: list[float] | np.ndarray,
                    confidence: float = 0.95, resamples: int = 2000, seed: int = 0
                    ) -> RatioEstimate:
    """current/base as a ratio of medians with a seeded percentile bootstrap CI."""
    a, b = _clean(base, "base"), _clean(current, "current")
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, a.size, size=(resamples, a.size))
    ib = rng.integers(0, b.size, size=(resamples, b.size))
    boot = np.median(b[ib], axis=1) / np.median(a[ia], axis=1)
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    p = float(stats.mannwhitneyu(b, a, alternative="two-sided").pvalue)
    return RatioEstimate(float(np.median(b) / np.median(a)), float(lo), float(hi), p,
                         a.size, b.size, "bootstrap of medians / Mann-Whitney U",
                         min_p_unpaired(a.size, b.size))


def estimate(base: list[float] | np.ndarray, current: list[float] | np.ndarray, *,
             paired: bool = False, method: str = "hl", confidence: float = 0.95
             ) -> RatioEstimate:
    """Dispatch: paired rounds use the signed-rank family; otherwise HL or bootstrap."""
    if paired:
        return ratio_paired(base, current, confidence)
    if method == "bootstrap":
        return ratio_bootstrap(base, current, confidence)
    return ratio_unpaired(base, current, confidence)
