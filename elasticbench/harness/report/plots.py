"""Plots drawn from the typed records alone (matplotlib, the optional `plot` extra).

- roofline, per mode and dtype: achieved GB/s against bytes per row; the measured copy
  bandwidth is the roof, the exp ceiling is drawn as the bandwidth it would allow, cache
  sizes are marked where one row stops fitting;
- time per row against n, per kernel, log-log, with the copy-roof time as a floor;
- accuracy heatmap, per mode: kernel x input -> worst error as a fraction of its budget,
  failures marked (forward and backward verification alike).

Figures are made with matplotlib's object API (no pyplot state), rendered to PNG bytes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from elasticbench.harness.records import ResultsFile, RunRecord, VerifyRecord
from elasticbench.harness.report.failures import as_float

INSTALL_HINT = "plots need matplotlib: pip install 'elasticbench[plot]'"
DPI = 110
MARKERS = "osD^vP*Xhp<>"
FAIL_COLOR = "#d62728"  # outline of a failed heatmap cell
OVER_COLOR = "#e8575a"  # a heatmap cell over its budget
R = TypeVar("R", RunRecord, VerifyRecord)


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass(frozen=True)
class Plot:
    """One rendered figure."""

    name: str  # file stem, e.g. "r-roofline-fwd-fp32"
    title: str
    alt: str  # what the picture shows, for people who cannot see it
    png: bytes


def require_matplotlib() -> None:
    """Raise PlotsUnavailable (one line, how to install it) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotsUnavailable(INSTALL_HINT) from None


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _bytes_label(b: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            v = b / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{b:.0f} B"


def _count_label(n: int) -> str:
    """4096 -> '4Ki', 1048576 -> '1Mi', 1000 -> '1,000': exact and short."""
    for unit, size in (("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size:,}{unit}"
    return f"{n:,}"


def _style_of(kernels: Iterable[str]) -> dict[str, tuple[Any, str]]:
    """A stable colour and marker per kernel name."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {k: (cmap(i % 10), MARKERS[i % len(MARKERS)]) for i, k in enumerate(kernels)}


def _timed(records: list[RunRecord]) -> list[RunRecord]:
    return [r for r in records if r.error is None and r.median_s]


def _by(records: list[R], key: Callable[[R], tuple]) -> dict[tuple, list[R]]:
    out: dict[tuple, list[R]] = {}
    for r in records:
        out.setdefault(key(r), []).append(r)
    return out


def _mode_dtype(r: RunRecord) -> tuple[str, str]:
    return (r.mode, r.dtype)


def _kernel_label(r: RunRecord) -> str:
    """The kernel's legend entry: says when it is the baseline or failed verification."""
    notes = ["baseline"] if r.baseline else []
    if r.status == "FAIL":
        notes.append("failed verification")
    return r.kernel + (f" ({', '.join(notes)})" if notes else "")


# ---------------------------------------------------------------- roofline

def _cache_marks(doc: dict[str, Any]) -> dict[str, int]:
    """The caches of the device the ceilings were measured on (older files: the host's)."""
    ceilings = doc.get("ceilings") or {}
    caches = ceilings.get("caches") or (doc.get("machine") or {}).get("caches") or {}
    return {k: int(v) for k, v in caches.items() if isinstance(v, int | float) and v > 0}


def _roofs(ceilings: dict[str, Any], mode: str, dtype: str, records: list[RunRecord]
           ) -> list[tuple[float, str, str]]:
    """(GB/s, label, line style) of each roof: the copy bandwidth, and forward the bandwidth
    the exp ceiling of the records' usual compute dtype allows."""
    roofs = []
    if ceilings.get("copy_gbps"):
        roofs.append((ceilings["copy_gbps"], f"copy roof {ceilings['copy_gbps']:.3g} GB/s", "-"))
    if mode == "fwd" and ceilings.get("exp_geps"):
        cdts = [r.compute_dtype for r in records if r.compute_dtype]
        cdt = max(set(cdts), key=cdts.count) if cdts else dtype
        rate = ceilings["exp_geps"].get(cdt)
        if rate:
            per_element = records[0].min_bytes / (records[0].shape[0] * records[0].shape[1])
            gbps = rate * per_element
            roofs.append((gbps, f"exp roof {gbps:.3g} GB/s (1 exp/element, {cdt})", "--"))
    return roofs


def roofline(doc: dict[str, Any], mode: str, dtype: str, records: list[RunRecord]) -> Any:
    """Achieved GB/s against bytes per row for every kernel, under the measured roofs."""
    ceilings = doc.get("ceilings") or {}
    fig = _figure(8.5, 5.2)
    ax = fig.add_subplot()
    kernels = list(dict.fromkeys(_kernel_label(r) for r in records))
    style = _style_of(kernels)
    xs = [r.min_bytes / r.shape[0] for r in records]
    ys = [r.gbps for r in records]
    for k in kernels:
        pts = sorted((r.min_bytes / r.shape[0], r.gbps, r.cache == "in-cache")
                     for r in records if _kernel_label(r) == k)
        color, marker = style[k]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, lw=1.2, alpha=0.7,
                label=k, marker=marker, markersize=0, ls="--" if "baseline" in k else "-")
        for x, y, in_cache in pts:
            ax.plot([x], [y], marker=marker, markersize=8, color=color,
                    markerfacecolor=color if in_cache else "white", markeredgewidth=1.6)
    roofs = _roofs(ceilings, mode, dtype, records)
    marks = _cache_marks(doc)
    lo = min([*xs, *marks.values()]) / 2
    hi = max([*xs, *marks.values()]) * 2
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    top = max([*ys, *(g for g, _, _ in roofs)]) * 3
    bottom = min(ys) / 3
    ax.set_ylim(bottom, top)
    for gbps, label, ls in roofs:
        ax.axhline(gbps, color="black", lw=2 if ls == "-" else 1.4, ls=ls, zorder=1, label=label)
    # Cache sizes on their own axis along the top, so their labels never cover a point.
    for size in marks.values():
        ax.axvline(size, color="0.55", lw=1, ls=":", zorder=0)
    if marks:
        top_axis = ax.secondary_xaxis("top")
        ordered = sorted(marks.items(), key=lambda kv: kv[1])
        top_axis.set_xticks([v for _, v in ordered],
                            [f"{k} {_bytes_label(v)}" for k, v in ordered], fontsize=8,
                            color="0.35")
        top_axis.minorticks_off()
        top_axis.tick_params(length=3, color="0.55")
    ticks = [2.0 ** e for e in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1, 2)]
    ax.set_xticks(ticks, [_bytes_label(t) for t in ticks], fontsize=8)
    ax.set_xlabel("minimum traffic per row (bytes: " + (
        "x, y, g read + dx written)" if mode == "bwd" else "x read + y written)"))
    ax.set_ylabel("achieved bandwidth (GB/s, minimum traffic)")
    ax.set_title(f"Roofline, {dtype} {mode} (dotted: cache sizes)", loc="left", fontsize=11)
    ax.grid(True, which="major", alpha=0.25)
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    for h in handles:
        h.set_markersize(7)
    handles += [Line2D([], [], marker="o", ls="", color="0.3", markersize=7),
                Line2D([], [], marker="o", ls="", color="0.3", markerfacecolor="white",
                       markersize=7)]
    labels += ["in cache (filled)", "out of cache (hollow)"]
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1),
              frameon=False)
    return fig


# ---------------------------------------------------------------- time against n

def time_vs_n(records: list[RunRecord], ceilings: dict[str, Any] | None) -> Any:
    """Median time per row against row length n, per kernel, one panel per (mode, dtype)."""
    groups = _by(records, _mode_dtype)
    fig = _figure(5.2 * len(groups) + 2.6, 4.8)
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    kernels = list(dict.fromkeys(_kernel_label(r) for r in records))
    style = _style_of(kernels)
    for ax, ((mode, dtype), recs) in zip(axes, groups.items(), strict=True):
        for k in kernels:
            mine = sorted((r for r in recs if _kernel_label(r) == k), key=lambda r: r.shape[1])
            if not mine:
                continue
            n = [r.shape[1] for r in mine]
            rows = [r.shape[0] for r in mine]
            med = [r.median_s * 1e6 / m for r, m in zip(mine, rows, strict=True)]
            lo = [max(0.0, v - r.timing.q1_ns * 1e-3 / m) if r.timing is not None else 0.0
                  for v, r, m in zip(med, mine, rows, strict=True)]
            hi = [max(0.0, r.timing.q3_ns * 1e-3 / m - v) if r.timing is not None else 0.0
                  for v, r, m in zip(med, mine, rows, strict=True)]
            color, marker = style[k]
            ax.errorbar(n, med, yerr=[lo, hi], color=color, marker=marker, markersize=6,
                        capsize=3, lw=1.3, ls="--" if "baseline" in k else "-", label=k)
        if ceilings and ceilings.get("copy_gbps"):
            ns = sorted({r.shape[1] for r in recs})
            per_el = recs[0].min_bytes / (recs[0].shape[0] * recs[0].shape[1])
            floor = [n * per_el / (ceilings["copy_gbps"] * 1e9) * 1e6 for n in ns]
            ax.plot(ns, floor, color="black", lw=1.2, ls=":", label="copy roof (time floor)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("row length n (elements)")
        ax.set_ylabel("median time per row (µs)")
        ax.set_title(f"{dtype} {mode}", loc="left")
        ax.grid(True, which="major", alpha=0.25)
        ns = sorted({r.shape[1] for r in recs})
        ax.set_xticks(ns, [_count_label(n) for n in ns], fontsize=8)
        ax.minorticks_off()
        if len(ns) == 1:
            ax.set_xlim(ns[0] / 2, ns[0] * 2)
        else:
            ax.set_xlim(ns[0] / 1.6, ns[-1] * 1.6)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="outside right upper", frameon=False)
    fig.suptitle("Time per row against row length (bars: interquartile range)",
                 x=0.01, ha="left", fontsize=11)
    return fig


# ---------------------------------------------------------------- accuracy heatmap

def _frac(r: VerifyRecord) -> float:
    if r.max_budget_frac is None:
        return math.inf if not r.passed else 0.0
    return as_float(r.max_budget_frac)


def _frac_text(f: float) -> str:
    if math.isinf(f):
        return "inf"
    if f < 0.01:
        return "<1%"
    if f < 1:
        return f"{100 * f:.0f}%"
    return f"{f:.3g}x" if f < 1e4 else f"{f:.0e}x".replace("e+0", "e").replace("e+", "e")


def accuracy_heatmap(records: list[VerifyRecord], mode: str) -> Any:
    """Kernel x input -> the worst error over dtypes, parameters and shapes, as a fraction of
    the budget (100% = at the budget); failed cells are outlined and marked."""
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm, to_rgba

    kernels = list(dict.fromkeys(r.kernel for r in records))
    inputs = list(dict.fromkeys(r.input for r in records))
    worst: dict[tuple[str, str], float] = {}
    failed: dict[tuple[str, str], int] = {}
    cases: dict[tuple[str, str], int] = {}
    for r in records:
        key = (r.kernel, r.input)
        worst[key] = max(worst.get(key, 0.0), _frac(r))
        cases[key] = cases.get(key, 0) + 1
        failed[key] = failed.get(key, 0) + (not r.passed)
    # Blue deepens as the error nears its budget; over budget is red, a missing cell grey.
    cmap = colormaps["Blues"].with_extremes(over=OVER_COLOR, bad="#eeeeee")
    norm = LogNorm(vmin=1e-3, vmax=1.0)
    # inf (a NaN or wrong special value) is drawn as "over budget", not as a missing cell.
    grid = [[min(max(worst[(k, i)], 1e-3), 1e30) if (k, i) in worst else math.nan
             for i in inputs] for k in kernels]
    width = min(2.6 + 0.62 * len(inputs) + 0.075 * max(len(k) for k in kernels), 20)
    fig = _figure(width, max(3.4, 1.6 + 0.34 * len(kernels)))
    ax = fig.add_subplot()
    im = ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    for y, k in enumerate(kernels):
        for x, i in enumerate(inputs):
            if (k, i) not in worst:
                continue
            f, bad = worst[(k, i)], failed[(k, i)]
            rgba = cmap(norm(max(f, 1e-3))) if f <= 1 else to_rgba(OVER_COLOR)
            light = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] > 0.5
            label = ("✗ " if bad else "") + _frac_text(f)
            ax.text(x, y, label, ha="center", va="center", fontsize=7,
                    color="black" if light else "white", fontweight="bold" if bad else "normal")
            if bad:
                ax.add_patch(_outline(x, y))
    ax.set_xticks(range(len(inputs)), inputs, rotation=40, ha="right", rotation_mode="anchor",
                  fontsize=8)
    ax.set_yticks(range(len(kernels)), kernels, fontsize=8)
    ax.tick_params(length=0)
    what = "dx" if mode == "bwd" else "output"
    ax.set_title(f"Accuracy ({'backward' if mode == 'bwd' else 'forward'}): worst {what} "
                 "error as a share of its budget", loc="left", fontsize=11)
    n_failed = sum(1 for v in failed.values() if v)
    ax.set_xlabel("input generator (worst over dtypes, parameters and shapes)\n"
                  f"✗ outlined: at least one case failed (accuracy, special values or "
                  f"contract), {n_failed} of {len(worst)} cells", fontsize=9)
    bar = fig.colorbar(im, ax=ax, extend="max", fraction=0.04, pad=0.02)
    bar.set_label("worst error / budget (red: over)", fontsize=8)
    bar.set_ticks([1e-3, 1e-2, 1e-1, 1], labels=["≤0.1%", "1%", "10%", "100%"], fontsize=8)
    return fig


def _outline(x: int, y: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor=FAIL_COLOR, lw=2)


# ---------------------------------------------------------------- all plots of a file

def plots_for(stem: str, results: ResultsFile) -> list[Plot]:
    """Every plot one results file supports; names start with `stem`."""
    require_matplotlib()
    out = []
    doc, records = results.doc, results.records
    if results.kind == "run":
        timed = _timed(records)
        for (mode, dtype), recs in _by(timed, _mode_dtype).items():
            kernels = ", ".join(dict.fromkeys(r.kernel for r in recs))
            out.append(Plot(f"{stem}-roofline-{mode}-{dtype}", f"Roofline, {dtype} {mode}",
                            f"Achieved GB/s against bytes per row for {kernels}, under the "
                            f"measured copy roof", _png(roofline(doc, mode, dtype, recs))))
        if timed:
            out.append(Plot(f"{stem}-time-vs-n", "Time per row against row length",
                            "Median time per row against n, log-log, per kernel",
                            _png(time_vs_n(timed, doc.get("ceilings")))))
    else:
        for (mode,), recs in _by(records, lambda r: (r.mode,)).items():
            out.append(Plot(f"{stem}-accuracy-{mode}",
                            f"Accuracy heatmap ({'backward' if mode == 'bwd' else 'forward'})",
                            "Kernel by input: worst error as a share of the budget; failed "
                            "cells marked", _png(accuracy_heatmap(recs, mode))))
    return out
