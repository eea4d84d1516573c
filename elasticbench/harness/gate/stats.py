"""Statistics of a performance comparison: is B slower than A, by how much, how sure are we.

Ratios are estimated in log space, where a slowdown by a factor is a shift:

* independent runs: each side is a set of processes, each with its own samples. Samples of
  one process agree with each other far better than processes agree among themselves (memory
  placement, frequency, neighbours), so the unit of replication is the process: each process
  is summarised by its log median, and the two sides are compared by a pooled two-sample t
  interval on those (a two-level model: between-process spread, within-process spread folded
  into it). With one process per side the spread is unknown: a noise floor measured from
  baselines stands in for it, or there is no verdict. A floor measured from several runs
  also knows the shift that all processes of one run share, which no single run can show;
  it widens the interval by that shift on each side. A hierarchical bootstrap (processes,
  then samples within each) is the cross-check;
* paired (an interleaved A/B run, one A and one B sample per round): the Wilcoxon signed-rank
  test on the per-round log ratios and the median of their Walsh averages, whose interval
  comes from the signed-rank distribution. Pairing cancels load that drifts between rounds.

exp(shift) is the ratio of (geometric means of) medians B/A.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np

Samples = Sequence[float] | np.ndarray
Groups = Sequence[Samples]  # the samples of each process, one array per process


@dataclass(frozen=True)
class NoiseFloor:
    """The spread of a kernel on a case in log time, in two levels: between the processes of
    one run (sd_log, with df degrees of freedom), and between runs, a shift that every process
    of a run shares (run_sd_log, with run_df; 0 when the runs showed none beyond what their
    processes explain, or when one run was measured)."""

    sd_log: float
    df: int
    run_sd_log: float = 0.0
    run_df: int = 0

    @property
    def percent(self) -> float:
        """The spread of one run's mean as a percentage of the time (exp(sd) - 1), the
        processes' spread and the shift between runs together."""
        return 100 * math.expm1(math.hypot(self.sd_log, self.run_sd_log))


@dataclass(frozen=True)
class RatioEstimate:
    """B/A as a factor: point estimate, confidence interval, two-sided p-value.

    `inconclusive` says why no interval could be had (lo, hi and p are then nan)."""

    ratio: float
    lo: float
    hi: float
    p: float
    n_base: int  # samples
    n_current: int
    method: str
    min_p: float  # the smallest p-value these sample sizes can reach
    processes: tuple[int, int] = (1, 1)
    noise: NoiseFloor | None = None  # the between-process spread the interval assumed
    inconclusive: str | None = None
    confidence: float = 0.95  # the level of [lo, hi]


def _scipy_stats() -> ModuleType:
    """scipy.stats, imported on first use: half a second of every command's start otherwise."""
    from scipy import stats

    return stats


def geomean(values: list[float] | np.ndarray) -> float:
    """Geometric mean of positive numbers (nan for an empty list)."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return math.nan
    return float(np.exp(np.mean(np.log(a))))


def _clean(samples: Samples, what: str) -> np.ndarray:
    a = np.asarray(samples, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0 or np.any(a <= 0):
        raise ValueError(f"{what}: need positive finite samples")
    return a


def _groups(groups: Groups, what: str) -> list[np.ndarray]:
    out = [_clean(g, f"{what} process {i + 1}") for i, g in enumerate(groups)]
    if not out:
        raise ValueError(f"{what}: no process")
    return out


def process_logs(groups: Groups) -> np.ndarray:
    """The log median of each process."""
    return np.log([np.median(g) for g in _groups(groups, "samples")])


def noise_floor(groups: Groups) -> NoiseFloor | None:
    """The spread of the log medians of the processes of one run (None with fewer than two)."""
    return noise_floor_of_runs([groups])


def noise_floor_of_runs(runs: Sequence[Groups]) -> NoiseFloor | None:
    """Both levels of spread from several runs of one plan (one-way random effects on the
    process log medians, runs as groups): the processes' spread pooled within runs, and the
    runs' own shift, (MS_between - MS_within) / P0 when positive. Runs of one process each
    cannot tell the levels apart: their whole spread is taken as the processes'. None when
    fewer than two processes were measured in all."""
    logs = [process_logs(g) for g in runs if len(g)]
    sizes = np.array([x.size for x in logs])
    n, r = int(sizes.sum()), len(logs)
    if n < 2:
        return None
    grand = np.concatenate(logs).mean()
    df_w = n - r
    if df_w == 0:  # one process a run: only the total spread is measured
        return NoiseFloor(float(np.std(np.concatenate(logs), ddof=1)), n - 1)
    ms_w = sum(float(np.sum((x - x.mean()) ** 2)) for x in logs) / df_w
    if r < 2:
        return NoiseFloor(math.sqrt(ms_w), df_w)
    ms_b = sum(x.size * (x.mean() - grand) ** 2 for x in logs) / (r - 1)
    p0 = (n - float(np.sum(sizes**2)) / n) / (r - 1)
    run_var = max(0.0, (ms_b - ms_w) / p0)
    return NoiseFloor(math.sqrt(ms_w), df_w, math.sqrt(run_var), r - 1 if run_var > 0 else 0)


def min_p_paired(n: int) -> float:
    """The smallest two-sided Wilcoxon signed-rank p-value with n pairs."""
    return min(1.0, 2.0 / 2.0**n)


def _spread(base: np.ndarray, current: np.ndarray, floors: Sequence[NoiseFloor | None]
            ) -> NoiseFloor | None:
    """The spread to assume, from the log medians of both sides' processes and a measured
    noise floor. Without a floor: pooled over both sides, no shift between runs known. With
    one (a baseline's, from every process of every run it was saved from): the floor's
    process spread pooled with the current side's processes, never below the floor (a
    baseline's runs may have seen spread that the processes of one run cannot show), and the
    floor's shift between runs. None when nothing measures it."""
    floor = max((f for f in floors if f is not None and f.df > 0),
                key=lambda f: math.hypot(f.sd_log, f.run_sd_log), default=None)
    if floor is None:
        df = base.size + current.size - 2
        if df == 0:
            return None
        ss = np.sum((base - base.mean()) ** 2) + np.sum((current - current.mean()) ** 2)
        return NoiseFloor(float(math.sqrt(ss / df)), df)
    df = floor.df + current.size - 1
    ss = floor.df * floor.sd_log**2 + np.sum((current - current.mean()) ** 2)
    return NoiseFloor(max(float(math.sqrt(ss / df)), floor.sd_log), df, floor.run_sd_log,
                      floor.run_df)


def _shift_error(spread: NoiseFloor, n_base: int, n_current: int) -> tuple[float, float]:
    """The standard error of the difference of the two sides' mean log medians, and its
    degrees of freedom: each side's processes, plus, per side, one shift between runs (each
    side is one run's, or one set of runs' processes, and that shift is shared by all of
    them). The two parts' degrees of freedom are combined by Welch-Satterthwaite."""
    procs = spread.sd_log**2 * (1 / n_base + 1 / n_current)
    runs = 2 * spread.run_sd_log**2
    var = procs + runs
    if runs == 0 or spread.run_df == 0:
        return math.sqrt(var), float(spread.df)
    df = var**2 / (procs**2 / spread.df + runs**2 / spread.run_df)
    return math.sqrt(var), float(df)


def ratio_processes(base: Groups, current: Groups, floors: Sequence[NoiseFloor | None] = (),
                    confidence: float = 0.95) -> RatioEstimate:
    """current/base from independent runs: the ratio of geometric means of process medians,
    a t interval over processes (and runs, with a baseline's floor), its p-value;
    inconclusive when no spread is known."""
    gb, gc = _groups(base, "base"), _groups(current, "current")
    lb, lc = np.log([np.median(g) for g in gb]), np.log([np.median(g) for g in gc])
    shift = float(lc.mean() - lb.mean())
    n_b, n_c = sum(g.size for g in gb), sum(g.size for g in gc)
    procs = (lb.size, lc.size)
    method = "process medians / pooled t"
    spread = _spread(lb, lc, floors)
    if spread is None:
        return RatioEstimate(math.exp(shift), math.nan, math.nan, math.nan, n_b, n_c, method,
                             1.0, procs, None,
                             "one process per side and no noise floor, so the spread between "
                             "processes is unknown; add processes (run --processes, more files "
                             "per side) or gate against a baseline saved from several runs")
    se, df = _shift_error(spread, lb.size, lc.size)
    if se == 0:
        p, half = (1.0 if shift == 0 else 0.0), 0.0
    else:
        p = float(2 * _scipy_stats().t.sf(abs(shift) / se, df))
        half = float(_scipy_stats().t.ppf(0.5 + confidence / 2, df)) * se
    return RatioEstimate(math.exp(shift), math.exp(shift - half), math.exp(shift + half), p,
                         n_b, n_c, method, 0.0, procs, spread, confidence=confidence)


def ratio_hierarchical_bootstrap(base: Groups, current: Groups, confidence: float = 0.95,
                                 resamples: int = 2000, seed: int = 0) -> RatioEstimate:
    """current/base with a seeded two-level bootstrap: processes drawn with replacement, then
    samples within each drawn process; the statistic is the mean log median of the processes.
    Needs two processes per side: one process cannot show the spread between processes."""
    gb, gc = _groups(base, "base"), _groups(current, "current")
    n_b, n_c = sum(g.size for g in gb), sum(g.size for g in gc)
    procs = (len(gb), len(gc))
    method = "hierarchical bootstrap of process medians"
    rng = np.random.default_rng(seed)

    def draws(groups: list[np.ndarray]) -> np.ndarray:
        k = len(groups)
        # medians[g, b, j]: process g's samples resampled for slot j of draw b
        medians = np.stack([np.median(g[rng.integers(0, g.size, size=(resamples, k, g.size))],
                                      axis=2) for g in groups])
        pick = rng.integers(0, k, size=(resamples, k))
        chosen = medians[pick, np.arange(resamples)[:, None], np.arange(k)[None, :]]
        return np.log(chosen).mean(axis=1)

    shift = float(np.mean(np.log([np.median(g) for g in gc]))
                  - np.mean(np.log([np.median(g) for g in gb])))
    if min(procs) < 2:
        return RatioEstimate(math.exp(shift), math.nan, math.nan, math.nan, n_b, n_c, method,
                             1.0, procs, None,
                             "the bootstrap needs two processes per side; the default t "
                             "interval can use a baseline's noise floor instead")
    d = np.sort(draws(gc) - draws(gb))
    lo, hi = _bootstrap_interval(d, confidence)
    p = float(min(1.0, max(2 * min(np.mean(d <= 0), np.mean(d >= 0)), 1 / resamples)))
    return RatioEstimate(math.exp(shift), math.exp(lo), math.exp(hi), p, n_b, n_c, method,
                         1 / resamples, procs, confidence=confidence)


def _bootstrap_interval(d: np.ndarray, confidence: float) -> tuple[float, float]:
    """The shifts s that the bootstrap test does not reject at 1 - confidence (at least
    that share of the sorted draws d on each side of s, counting draws equal to s): the
    interval excludes 0 exactly when the test's p is below 1 - confidence."""
    tail = max(1, math.ceil((1 - confidence) / 2 * d.size - 1e-9))
    return float(d[tail - 1]), float(d[d.size - tail])


def _signed_rank_method(r: np.ndarray) -> str:
    """scipy's exact signed-rank distribution when it applies to every shift of r tried
    (50 rounds or fewer, no tied or zero log ratios), else its normal approximation: one
    method for the p-value and the interval, so that they agree."""
    exact = r.size <= 50 and np.unique(np.abs(r)).size == r.size and not np.any(r == 0)
    return "exact" if exact else "asymptotic"


def _signed_rank_p(r: np.ndarray, shift: float, method: str) -> float:
    """Two-sided Wilcoxon signed-rank p-value of the log ratios r - shift."""
    return float(_scipy_stats().wilcoxon(r - shift, zero_method="pratt", alternative="two-sided",
                                method=method).pvalue)


def _signed_rank_interval(r: np.ndarray, walsh: np.ndarray, centre: float, confidence: float,
                          method: str) -> tuple[float, float]:
    """The shifts the signed-rank test does not reject at 1 - confidence: between two
    consecutive Walsh averages the test's statistic is constant, so the interval runs from
    the first accepted gap's lower Walsh average to the last accepted gap's upper one (found
    by bisection: p rises towards the centre and falls after it)."""
    u = np.unique(walsh)
    if u.size == 1:
        return float(u[0]), float(u[0])
    mids = (u[:-1] + u[1:]) / 2
    ok = [None] * mids.size

    def accepted(k: int) -> bool:
        if ok[k] is None:
            ok[k] = _signed_rank_p(r, float(mids[k]), method) >= 1 - confidence
        return bool(ok[k])

    c = int(np.clip(np.searchsorted(mids, centre), 0, mids.size - 1))
    if not accepted(c):
        return centre, centre
    a, b = 0, c  # first accepted gap in [a, b]
    while a < b:
        m = (a + b) // 2
        a, b = (a, m) if accepted(m) else (m + 1, b)
    first = a
    a, b = c, mids.size - 1  # last accepted gap in [a, b]
    while a < b:
        m = (a + b + 1) // 2
        a, b = (m, b) if accepted(m) else (a, m - 1)
    return float(u[first]), float(u[a + 1])


def ratio_paired(base: Samples, current: Samples, confidence: float = 0.95) -> RatioEstimate:
    """current/base from paired rounds: the median of the Walsh averages of the per-round log
    ratios, the Wilcoxon signed-rank p-value (scipy), and the interval that inverts the same
    test, so the interval excludes 1 exactly when p < 1 - confidence."""
    a, b = _clean(base, "base"), _clean(current, "current")
    if a.size != b.size:
        raise ValueError("paired samples need as many base as current samples")
    r = np.log(b) - np.log(a)
    n = r.size
    i, j = np.triu_indices(n)
    w = np.sort((r[i] + r[j]) / 2)
    centre = float(np.median(w))
    if np.all(r == 0):
        p, lo, hi = 1.0, 0.0, 0.0
    else:
        method = _signed_rank_method(r)
        p = _signed_rank_p(r, 0.0, method)
        lo, hi = _signed_rank_interval(r, w, centre, confidence, method)
    return RatioEstimate(math.exp(centre), math.exp(lo), math.exp(hi), p, n, n,
                         "Walsh median / Wilcoxon signed-rank", min_p_paired(n),
                         confidence=confidence)


METHODS = ("t", "bootstrap")


def estimate(base: Groups, current: Groups, *, paired: bool = False, method: str = "t",
             floors: Sequence[NoiseFloor | None] = (), confidence: float = 0.95
             ) -> RatioEstimate:
    """Dispatch: paired rounds (one process, one group per side) use the signed-rank family;
    independent runs the process t interval, or the hierarchical bootstrap."""
    if paired:
        return ratio_paired(np.concatenate(base), np.concatenate(current), confidence)
    if method == "bootstrap":
        return ratio_hierarchical_bootstrap(base, current, confidence)
    if method != "t":
        raise ValueError(f"unknown interval {method!r} (choose from {', '.join(METHODS)})")
    return ratio_processes(base, current, floors, confidence)
