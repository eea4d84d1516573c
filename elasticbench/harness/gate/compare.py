"""Compare two datasets case by case, and decide whether a gate passes.

Every row prints one interval of the ratio (current cost / base cost; > 1 is slower): the
interval at level interval_level(alpha), 95% for alpha <= 0.05 and 1 - alpha above it. Each
method's interval inverts its own test, so for alpha >= 0.05 the interval excludes 1 exactly
when p < alpha. The timing verdict of a case never contradicts that interval:

* `slower`: p < alpha and the whole interval lies above 1;
* `faster`: p < alpha and the whole interval lies below 1;
* `not significant` (with its direction): the interval excludes 1, p is not below alpha
  (alpha <= p < 0.05 at 95%): a difference the interval shows at its level and
  the test does not confirm at alpha;
* `same`: the interval contains 1;
* `inconclusive`: both sides measured, but the spread between processes is unknown (one
  process per side and no noise floor), so no interval can be trusted;
* `not comparable`: a side is missing or failed to run, or the samples are too few for p to
  ever reach alpha (then no verdict would mean anything).

The gate fails on timing only for a *regression*: `slower` AND the lower end of the printed
interval above 1 + max_slowdown (criterion's rule: the interval entirely outside the noise
band; asv's adds the significance test). It fails on numerics when a verification that
passed now fails, or the worst error's share of its budget crossed 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elasticbench.harness.gate.load import Dataset, Series, Verdict, machine_differences
from elasticbench.harness.gate.stats import NoiseFloor, RatioEstimate, estimate, geomean

VERDICTS = ("slower", "faster", "not significant", "same", "inconclusive", "not comparable")
MIN_LEVEL = 0.95  # the interval is never printed at a level below this


@dataclass
class Row:
    """The timing comparison of one kernel on one case."""

    kernel: str
    case: str
    base: float | None  # median cost
    current: float | None
    est: RatioEstimate | None
    verdict: str
    reason: str | None = None
    regression: bool = False

    @property
    def direction(self) -> str | None:
        """The side of 1 the interval lies on ("slower" above, "faster" below); None when it
        contains 1 or there is none."""
        e = self.est
        if e is None or e.inconclusive:
            return None
        return "slower" if e.lo > 1 else "faster" if e.hi < 1 else None

    @property
    def label(self) -> str:
        """The verdict as printed: `not significant` names its direction."""
        if self.verdict == "not significant" and self.direction:
            return f"not significant, {self.direction}"
        return self.verdict


@dataclass
class NumericsRow:
    """The numerics comparison of one kernel on one case (or dtype)."""

    kernel: str
    case: str
    base: Verdict | None
    current: Verdict | None
    regression: bool
    note: str | None = None


@dataclass
class Rollup:
    """Geometric-mean ratio of a kernel over its comparable cases."""

    kernel: str
    ratio: float
    cases: int
    counts: dict[str, int]


@dataclass
class Comparison:
    """Everything compare and gate print, and what the gate decides."""

    base_path: str
    current_path: str
    metric: str
    alpha: float
    max_slowdown: float
    paired: bool
    rows: list[Row] = field(default_factory=list)
    numerics: list[NumericsRow] = field(default_factory=list)
    rollups: list[Rollup] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timing_advisory: bool = False

    @property
    def confidence(self) -> float:
        """The level of every interval in the comparison."""
        return interval_level(self.alpha)

    @property
    def timing_regressions(self) -> list[Row]:
        return [r for r in self.rows if r.regression]

    @property
    def numerics_regressions(self) -> list[NumericsRow]:
        return [r for r in self.numerics if r.regression]

    @property
    def failed(self) -> bool:
        """True when the gate should exit 1."""
        timing = bool(self.timing_regressions) and not self.timing_advisory
        return timing or bool(self.numerics_regressions)


def interval_level(alpha: float) -> float:
    """The level of the printed interval: 95%, or 1 - alpha when alpha is above 0.05 (so a
    p below alpha always means an interval that excludes 1)."""
    return min(MIN_LEVEL, 1 - alpha)


def judge(est: RatioEstimate, alpha: float, max_slowdown: float) -> tuple[str, bool, str | None]:
    """(verdict, regression, reason) of one ratio estimate, its interval at the level
    interval_level(alpha): the verdict never says what its interval contradicts."""
    if est.inconclusive:
        return "inconclusive", False, est.inconclusive
    if est.min_p >= alpha:
        return ("not comparable", False,
                f"{est.n_base}+{est.n_current} samples cannot reach p < {alpha:g}")
    above, below = est.lo > 1, est.hi < 1
    if est.p < alpha and above:
        return "slower", est.lo > 1 + max_slowdown, None
    if est.p < alpha and below:
        return "faster", False, None
    if above or below:
        return "not significant", False, f"p {est.p:.2g} >= alpha {alpha:g}"
    return "same", False, None


def compare_series(base: Series | None, current: Series | None, *, alpha: float,
                   max_slowdown: float, paired: bool = False, method: str = "t",
                   floors: tuple[NoiseFloor | None, ...] = ()) -> Row:
    """The row of one case; either side may be missing."""
    ref = current or base
    assert ref is not None
    row = Row(ref.kernel, ref.case, base.median if base else None,
              current.median if current else None, None, "not comparable")
    if base is None or current is None:
        row.reason = "only in current" if base is None else "missing from current"
    elif base.error or current.error:
        row.reason = f"{'base' if base.error else 'current'}: {base.error or current.error}"
    elif base.groups is None or current.groups is None:
        row.reason = "no raw samples (statistics only)"
    else:
        row.est = estimate(base.groups, current.groups, paired=paired, method=method,
                           floors=floors, confidence=interval_level(alpha))
        row.verdict, row.regression, row.reason = judge(row.est, alpha, max_slowdown)
    return row


def compare_numerics(base: Verdict | None, current: Verdict | None) -> NumericsRow:
    """Regression: a pass became a fail, or the budget share crossed 1."""
    ref = current or base
    assert ref is not None
    row = NumericsRow(ref.kernel, ref.case, base, current, False)
    if current is None:
        row.note = "not verified in current"
    elif base is None:
        if current.passed is False:
            row.note = f"new and failing: {current.reason}"
    elif base.passed is True and current.passed is False:
        row.regression = True
        row.note = f"passed, now fails: {current.reason}"
    elif (base.budget_frac is not None and current.budget_frac is not None
          and base.budget_frac <= 1 < current.budget_frac):
        row.regression = True
        row.note = f"worst error grew past its budget ({current.budget_frac:.2f} of it)"
    elif base.passed is False and current.passed is False:
        row.note = "failed before and still fails"
    elif base.passed is False and current.passed is True:
        row.note = "fixed"
    elif (base.max_ulp and current.max_ulp is not None and current.max_ulp > 2 * base.max_ulp
          and current.max_ulp > 1):
        row.note = f"worst error grew {current.max_ulp / base.max_ulp:.1f}x (within budget)"
    return row


def _rollups(rows: list[Row]) -> list[Rollup]:
    by: dict[str, list[Row]] = {}
    for r in rows:
        by.setdefault(r.kernel, []).append(r)
    out = []
    for kernel, rs in by.items():
        ratios = [r.est.ratio for r in rs if r.est is not None and r.verdict != "not comparable"]
        counts = {v: sum(r.verdict == v for r in rs) for v in VERDICTS}
        out.append(Rollup(kernel, geomean(ratios), len(ratios), counts))
    return out


def compare(base: Dataset, current: Dataset, *, alpha: float = 0.01,
            max_slowdown: float = 0.10, paired: bool = False, method: str = "t",
            timing_advisory: bool = False) -> Comparison:
    """Compare every case of the two datasets, timing and numerics."""
    if base.metric != current.metric:
        raise ValueError("both sides must be read with the same metric")
    cmp = Comparison(base.path, current.path, base.metric, alpha, max_slowdown, paired,
                     timing_advisory=timing_advisory)
    diffs = machine_differences(base, current)
    if diffs:
        cmp.warnings.append("the machines differ (" + "; ".join(diffs) + ")" + (
            ": timing ratios mix code and machine; prefer --metric bandwidth-fraction"
            if base.metric == "time" else ""))
    cmp.warnings += base.notes + current.notes
    if {base.kind, current.kind} == {"run", "verify"}:
        cmp.warnings.append("one file is a run and the other a verification: "
                            "nothing of one can be compared with the other")
    for key in dict.fromkeys([*base.series, *current.series]):
        cmp.rows.append(compare_series(base.series.get(key), current.series.get(key),
                                       alpha=alpha, max_slowdown=max_slowdown, paired=paired,
                                       method=method,
                                       floors=(base.noise.get(key), current.noise.get(key))))
    for key in dict.fromkeys([*base.numerics, *current.numerics]):
        cmp.numerics.append(compare_numerics(base.numerics.get(key), current.numerics.get(key)))
    cmp.rollups = _rollups(cmp.rows)
    if not cmp.rows and not cmp.numerics:
        cmp.warnings.append("the two files have nothing in common to compare")
    return cmp


def parse_fraction(text: str) -> float:
    """'10%' -> 0.10, '0.1' -> 0.1; a bare number of 1 or more must carry a % sign."""
    t = str(text).strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ValueError(f"a threshold is a percentage like 10% (or a fraction like 0.1); "
                         f"got {text!r}") from None
    if not t.endswith("%") and value >= 1:
        raise ValueError(f"ambiguous threshold {text!r}: write {value:g}% or {value / 100:g}")
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"a threshold must be a finite amount >= 0; got {text!r}")
    return value
