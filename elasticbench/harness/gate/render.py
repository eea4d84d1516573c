"""Text and Markdown views of a Comparison. Both read the Comparison, never the files."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from elasticbench.harness.gate.compare import VERDICTS, Comparison, NumericsRow, Row

MARK = {"slower": "🔴", "faster": "🟢", "not significant": "🟡", "same": "⚪", "inconclusive": "❔",
        "not comparable": "⚫"}


def fmt_cost(value: float | None, metric: str) -> str:
    """A median cost in the metric's natural unit: a time, or a % of copy bandwidth."""
    if value is None or not math.isfinite(value):
        return "—"
    if metric == "bandwidth-fraction":
        return f"{100 / value:.1f}% copy"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e9:.3g} ns"


def fmt_bound(value: float, marks: tuple[float, ...] = (1.0,)) -> str:
    """An interval end to 3 decimals, or more where 3 would round it onto or across one of
    the marks (1, and the gate's threshold): the printed end lies on the same side of each
    mark as the end itself."""
    for digits in range(3, 10):
        text = f"{value:.{digits}f}"
        shown = float(text)
        if all((shown > m) == (value > m) and (shown < m) == (value < m) for m in marks):
            return text
    return repr(value)


def fmt_ratio(row: Row, max_slowdown: float | None = None) -> str:
    """'ratio [lo, hi]'; the ends are printed on the right side of 1 and of 1 + max_slowdown."""
    if row.est is None:
        return "—"
    e = row.est
    if e.inconclusive:
        return f"{e.ratio:.3f} [—]"
    marks = (1.0,) if max_slowdown is None else (1.0, 1 + max_slowdown)
    return f"{e.ratio:.3f} [{fmt_bound(e.lo, marks)}, {fmt_bound(e.hi, marks)}]"


def level(cmp: Comparison) -> str:
    """The level of the comparison's intervals, e.g. '95%'."""
    return f"{100 * cmp.confidence:g}%"


def fmt_p(row: Row) -> str:
    return "—" if row.est is None or row.est.inconclusive else f"{row.est.p:.2g}"


def fmt_processes(row: Row) -> str:
    """Processes per side, and the between-process spread the interval assumed."""
    if row.est is None:
        return "—"
    b, c = row.est.processes
    noise = row.est.noise
    return f"{b}+{c}" + ("" if noise is None else f" ±{noise.percent:.1f}%")


def _ulp(v) -> str:
    if v is None:
        return "—"
    state = {True: "pass", False: "FAIL", None: "unverified"}[v.passed]
    return state + ("" if v.max_ulp is None else f" {v.max_ulp:.3g} ulp")


def headline(cmp: Comparison) -> str:
    """One line: the gate's decision and why."""
    t, n = cmp.timing_regressions, cmp.numerics_regressions
    parts = []
    if n:
        parts.append(f"{len(n)} numerics regression(s)")
    if t:
        parts.append(f"{len(t)} timing regression(s)" + (" (advisory)" if cmp.timing_advisory
                                                            else ""))
    if not cmp.failed:
        return "PASS" + (f": {', '.join(parts)}" if parts else
                         f": no kernel slower by more than {100 * cmp.max_slowdown:g}% "
                         f"at alpha {cmp.alpha:g}, no numerics regression")
    return "FAIL: " + ", ".join(parts)


def render_text(cmp: Comparison, console: Console, gate: bool = False) -> None:
    """Tables on a console: timing rows, rollups, numerics changes, warnings."""
    for w in cmp.warnings:
        console.print(f"warning: {w}")
    if cmp.rows:
        t = Table(title=f"{cmp.metric}: current vs base "
                        f"({'paired rounds' if cmp.paired else 'independent runs'}), "
                        f"ratio with its {level(cmp)} interval, alpha {cmp.alpha:g}")
        for col in ("kernel", "case", "base", "current", f"ratio [{level(cmp)} CI]", "p",
                    "processes", "verdict"):
            t.add_column(col, justify="right" if col in ("base", "current", "p") else "left")
        for r in cmp.rows:
            verdict = r.label + (" REGRESSION" if r.regression else "") + (
                f" ({r.reason})" if r.reason else "")
            t.add_row(r.kernel, r.case, fmt_cost(r.base, cmp.metric),
                      fmt_cost(r.current, cmp.metric), fmt_ratio(r, cmp.max_slowdown), fmt_p(r),
                      fmt_processes(r), verdict)
        console.print(t)
        roll = Table(title="per kernel (geometric mean of ratios)")
        for col in ("kernel", "ratio", "cases", "slower", "faster", "n.s.", "same", "inconcl.",
                    "n/c"):
            roll.add_column(col)
        for k in cmp.rollups:
            roll.add_row(k.kernel, "—" if k.cases == 0 else f"{k.ratio:.3f}", str(k.cases),
                         *(str(k.counts[v]) for v in VERDICTS))
        console.print(roll)
    changed = [n for n in cmp.numerics if n.regression or n.note]
    if changed:
        t = Table(title="numerics")
        for col in ("kernel", "case", "base", "current", "change"):
            t.add_column(col)
        for n in changed:
            t.add_row(n.kernel, n.case, _ulp(n.base), _ulp(n.current),
                      ("REGRESSION: " if n.regression else "") + (n.note or ""))
        console.print(t)
    elif cmp.numerics:
        console.print(f"numerics: {len(cmp.numerics)} verdicts, none changed for the worse")
    if gate:
        console.print(headline(cmp))


def _md_numerics(n: NumericsRow) -> str:
    return (f"| {n.kernel} | {n.case} | {_ulp(n.base)} | {_ulp(n.current)} | "
            f"{'**REGRESSION** ' if n.regression else ''}{n.note or ''} |")


def render_markdown(cmp: Comparison) -> str:
    """A PR comment: the decision first, then only what matters, full tables folded."""
    lines = [f"### elasticbench gate: {'❌' if cmp.failed else '✅'} {headline(cmp)}", ""]
    lines.append(f"Metric **{cmp.metric}**, threshold {100 * cmp.max_slowdown:g}% slower, "
                 f"alpha {cmp.alpha:g}, {level(cmp)} intervals, "
                 f"{'paired A/B rounds' if cmp.paired else 'two runs'}; "
                 f"base `{cmp.base_path}`, current `{cmp.current_path}`.")
    for w in cmp.warnings:
        lines.append(f"> ⚠️ {w}")
    lines.append("")
    bad_n = cmp.numerics_regressions
    if bad_n:
        lines += ["**Numerics regressions**", "", "| kernel | case | base | current | change |",
                  "|---|---|---|---|---|", *map(_md_numerics, bad_n), ""]
    header = [f"| | kernel | case | base | current | ratio [{level(cmp)} CI] | p | processes |",
              "|---|---|---|---|---|---|---|---|"]

    def md_row(r: Row) -> str:
        mark = MARK[r.verdict] + (f" {r.label}" if r.verdict == "not significant" else "") + (
            " **regression**" if r.regression else "")
        return (f"| {mark} | {r.kernel} | {r.case} | {fmt_cost(r.base, cmp.metric)} | "
                f"{fmt_cost(r.current, cmp.metric)} | {fmt_ratio(r, cmp.max_slowdown)} | {fmt_p(r)} | "
                f"{fmt_processes(r)} |")

    notable = [r for r in cmp.rows if r.verdict in ("slower", "faster")]
    if notable:
        lines += ["**Significant changes**", "", *header, *map(md_row, notable), ""]
    if cmp.rollups:
        lines += ["| kernel | geomean ratio | " + " | ".join(MARK[v] for v in VERDICTS) + " |",
                  "|---|---|" + "---|" * len(VERDICTS)]
        for k in cmp.rollups:
            lines.append(f"| {k.kernel} | {'—' if k.cases == 0 else f'{k.ratio:.3f}'} | "
                         + " | ".join(str(k.counts[v]) for v in VERDICTS) + " |")
        lines.append("")
    if cmp.rows:
        lines += ["<details><summary>All cases</summary>", "", *header,
                  *map(md_row, cmp.rows), "", "</details>", ""]
    inconclusive = sum(r.verdict == "inconclusive" for r in cmp.rows)
    if inconclusive:
        lines.append(f"❔ {inconclusive} case(s) inconclusive: one process per side and no "
                     "noise floor, so the spread between processes is unknown.")
        lines.append("")
    lines.append(f"Ratio = current / base cost (> 1 is slower), with its {level(cmp)} interval. "
                 "Slower or faster: p < alpha and the interval on that side of 1; 🟡 not "
                 "significant: the interval excludes 1 but p is not below alpha; a regression "
                 "needs slower and the whole interval above 1 + threshold; processes: per "
                 "side, with the spread between processes the interval assumed.")
    return "\n".join(lines) + "\n"
