"""Run tables: per function, kernel x size -> median, GB/s, % of copy bandwidth, % of roof,
speedup over the baseline, verdict. Works on the typed records alone (a saved file renders
the same); every record holds its measurement or its error (RunRecord.check_measured).
`run_sheets` is the tabulation every format shares; `render_run` prints it to a terminal.

A table whose records declare the kernel they wrap (RunRecord.wraps: an API kernel names
the raw kernel its call runs) gets an `overhead` column: the record's median over that
kernel's median in the same cell (function, mode, dtype, shape and parameters) of the same
records, blank where that kernel was not timed there. A table whose records say how their
kernels launched (RunRecord.launch) gets a last `launch` column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rich.console import Console

from elasticbench.harness.records import RunRecord
from elasticbench.harness.report.sheet import EMPTY, Column, Entry, Note, Sheet, Span, entry, note

CAPTION = ("size* in cache; GB/s: minimum traffic; roof e/m: exp/memory binds; "
           "base*: baseline failed verification")

COLUMNS = [
    Column("kernel", wrap=False),
    Column("size", ("rows", "n", "dtype", "cache")),
    Column("median", ("median_s",), align="right", wrap=False),
    Column("GB/s", ("gbps",), align="right", wrap=False),
    Column("%copy", ("pct_copy",), align="right", wrap=False),
    Column("%roof", ("pct_roof", "binding"), align="right", wrap=False),
    Column("x base", ("speedup",), align="right", wrap=False),
    Column("verify", ("verify",), wrap=False),
]


OVERHEAD = Column("overhead", ("overhead", "wraps"), align="right", wrap=False)
OVERHEAD_CAPTION = "overhead: median / median of the kernel it wraps (named) in the same cell"


def _cell_of(kernel: str, r: RunRecord) -> tuple:
    """Where kernel's record beside r sits: r's function, mode, dtype, shape and parameters."""
    return (kernel, r.function, r.mode, r.dtype, tuple(r.shape),
            tuple(sorted(r.params.items())))


def overheads(records: list[RunRecord]) -> dict[int, float]:
    """id(record) -> its median over the median of the kernel it wraps (RunRecord.wraps) at
    the same function, mode, dtype, shape and parameters among these records (one run); a
    record whose wrapped kernel was not timed there has none."""
    medians = {_cell_of(r.kernel, r): r.median_s for r in records
               if r.error is None and r.median_s}
    out = {}
    for r in records:
        base = medians.get(_cell_of(r.wraps, r)) if r.wraps else None
        if base and r.error is None and r.median_s:
            out[id(r)] = r.median_s / base
    return out


def _overhead(r: RunRecord, ratios: dict[int, float]) -> Entry:
    ratio = ratios.get(id(r))
    if ratio is None:
        return EMPTY
    return entry(f"{ratio:.2f}x {r.wraps}", values=(ratio, r.wraps))


LAUNCH = Column("launch", ("launch",))
LAUNCH_CAPTION = "launch: how the kernel's host code launched it (plan, tiles)"


def _insert_column(sheet: Sheet, recs: list[RunRecord], column: Column, after: str,
                   cell: Callable[[RunRecord], Entry], caption: str) -> Sheet:
    """The sheet with `column` after the column headed `after` (rows in the records' order,
    one per record), and its caption added."""
    at = [c.header for c in sheet.columns].index(after) + 1
    rows = [[*row[:at], cell(r), *row[at:]] for row, r in zip(sheet.rows, recs, strict=True)]
    columns = [*sheet.columns[:at], column, *sheet.columns[at:]]
    return replace(sheet, columns=columns, rows=rows, caption=f"{sheet.caption}; {caption}")


def _with_extras(sheet: Sheet, recs: list[RunRecord], ratios: dict[int, float]) -> Sheet:
    """The sheet with an overhead column after `x base` where a record declares what it
    wraps, and a launch column last where a record says how it launched."""
    if any(r.wraps for r in recs):
        sheet = _insert_column(sheet, recs, OVERHEAD, "x base",
                               lambda r: _overhead(r, ratios), OVERHEAD_CAPTION)
    if any(r.launch for r in recs):
        sheet = _insert_column(sheet, recs, LAUNCH, sheet.columns[-1].header,
                               lambda r: entry(r.launch, values=(r.launch,)) if r.launch
                               else EMPTY, LAUNCH_CAPTION)
    return sheet


def format_time(s: float) -> str:
    """Seconds in the unit that keeps three or four significant digits."""
    if s >= 1:
        return f"{s:.2f}s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f}ms"
    return f"{s * 1e6:.1f}µs"


def _size(r: RunRecord, dtypes: int) -> Entry:
    rows, n = r.shape
    text = f"{rows}x{n}" + (f" {r.dtype}" if dtypes > 1 else "")
    text += "*" if r.cache == "in-cache" else ""
    return entry(text, values=(rows, n, r.dtype, r.cache))


def _verdict(r: RunRecord) -> Entry:
    status = r.status
    if r.error is not None:
        return entry("ERROR", "fail")
    if r.baseline:
        return entry("base", values=(status,)) if status == "pass" else \
            entry("base*", "warn", values=(status,))
    tag = {"pass": "ok", "FAIL": "fail"}.get(status, "dim")
    return entry(status, tag)


def group_records(records: list[RunRecord]) -> dict[str, list[RunRecord]]:
    """Records by table: "<function> (<mode>)", in first-seen order."""
    groups: dict[str, list[RunRecord]] = {}
    for r in records:
        groups.setdefault(f"{r.function} ({r.mode})", []).append(r)
    return groups


ATTENTION_CAPTION = ("size: batch x heads x length x head dim; GFLOP/s: the matmuls' FLOPs; "
                     "%mm: of the measured matmul ceiling; roof m/M: matmul/memory binds; "
                     "peak: resident memory growth in one call")

ATTENTION_COLUMNS = [
    Column("kernel", wrap=False),
    Column("size", ("shape", "causal", "padded", "gate", "dtype")),
    Column("median", ("median_s",), align="right", wrap=False),
    Column("GFLOP/s", ("gflops",), align="right", wrap=False),
    Column("%mm", ("pct_matmul",), align="right", wrap=False),
    Column("%roof", ("pct_roof", "binding"), align="right", wrap=False),
    Column("peak", ("peak_bytes",), align="right", wrap=False),
    Column("x base", ("speedup",), align="right", wrap=False),
    Column("verify", ("verify",), wrap=False),
]


GATED_CAPTION = ("gated: out * gate (bwd: d gate too), the baseline ungated in its cell "
                 "(`gated cell`); vs ungated: median over the same kernel's ungated one")


def gate_label(r: RunRecord) -> str:
    """"gated" for a call that took a gate, "gated cell" for a gated cell's baseline (which
    runs ungated), "" for an ungated cell (and records written before gated cells)."""
    if not r.params.get("gate"):
        return ""
    return "gated cell" if r.baseline else "gated"


def _attention_size(r: RunRecord, dtypes: int) -> Entry:
    b, h, lq, lk, d = r.shape
    causal = bool(r.params.get("causal"))
    text = f"{b}x{h}x{lq}{'' if lq == lk else f'x{lk}'}x{d}" + (" causal" if causal else "")
    if r.params.get("padded"):
        text += f" {r.params['padded']:.0%} padded"
    gate = gate_label(r)
    text += f" {gate}" if gate else ""
    text += f" {r.dtype}" if dtypes > 1 else ""
    return entry(text, values=(list(r.shape), causal, r.params.get("padded", 0.0),
                               r.params.get("gate", 0.0), r.dtype))


def gate_costs(records: list[RunRecord]) -> dict[int, float]:
    """id(record) -> a gated call's median over the same kernel's median in the ungated cell
    beside it (mode, dtype, shape and every other parameter equal), among these records."""
    def ungated(r: RunRecord) -> tuple:
        return (r.kernel, r.function, r.mode, r.dtype, tuple(r.shape),
                tuple(sorted((k, v) for k, v in r.params.items() if k != "gate")))
    medians = {ungated(r): r.median_s for r in records
               if not r.params.get("gate") and r.error is None and r.median_s}
    out = {}
    for r in records:
        base = medians.get(ungated(r)) if gate_label(r) == "gated" else None
        if base and r.error is None and r.median_s:
            out[id(r)] = r.median_s / base
    return out


VS_UNGATED = Column("vs ungated", ("gate_cost",), align="right", wrap=False)


def _mib(v: int | None) -> Entry:
    return EMPTY if v is None else entry(f"{v / 2**20:.0f} MiB", values=(v,))


def attention_sheet(name: str, recs: list[RunRecord]) -> Sheet:
    """A row per timed attention (kernel, size, causal, padded, gate): time, FLOP rate, roof,
    memory; where a record is gated, a `vs ungated` column after `x base`."""
    ndt = len({r.dtype for r in recs})
    sheet = Sheet(name, name, list(ATTENTION_COLUMNS), caption=ATTENTION_CAPTION, compact=True)
    for r in recs:
        if r.error is not None:
            sheet.add(entry(r.kernel), _attention_size(r, ndt), *[EMPTY] * 6, _verdict(r))
            continue
        sp = r.speedup
        binding = {"matmul": "m", "memory": "M"}.get(r.binding, r.binding[0])
        sheet.add(
            entry(r.kernel), _attention_size(r, ndt),
            entry(format_time(r.median_s), values=(r.median_s,)),
            entry(f"{r.gflops:.1f}", values=(r.gflops,)),
            entry(f"{r.pct_matmul:.0f}%", values=(r.pct_matmul,)),
            entry(f"{r.pct_roof:.0f}% {binding}", values=(r.pct_roof, r.binding)),
            _mib(r.peak_bytes),
            entry(f"{sp:.2f}", values=(sp,)) if sp else EMPTY,
            _verdict(r),
        )
    if any(gate_label(r) == "gated" for r in recs):
        costs = gate_costs(recs)
        sheet = _insert_column(
            sheet, recs, VS_UNGATED, "x base",
            lambda r: entry(f"{costs[id(r)]:.3f}x", values=(costs[id(r)],))
            if id(r) in costs else EMPTY, GATED_CAPTION)
    return sheet


def run_sheets(records: list[RunRecord]) -> list[Sheet]:
    """One sheet per function and mode: a row per timed (kernel, size); an overhead column
    where a record declares the kernel it wraps, a launch column where one says how it
    launched."""
    ratios = overheads(records)
    return [_with_extras(attention_sheet(name, recs) if len(recs[0].shape) == 5  # attention
                         else row_sheet(name, recs), recs, ratios)
            for name, recs in group_records(records).items()]


def row_sheet(name: str, recs: list[RunRecord]) -> Sheet:
    """A row per timed (kernel, size) of a row function: time, rates, roof, speedup."""
    ndt = len({r.dtype for r in recs})
    sheet = Sheet(name, name, list(COLUMNS), caption=CAPTION, compact=True)
    for r in recs:
        if r.error is not None:
            sheet.add(entry(r.kernel), _size(r, ndt), *[EMPTY] * 5, _verdict(r))
            continue
        sp = r.speedup
        sheet.add(
            entry(r.kernel), _size(r, ndt),
            entry(format_time(r.median_s), values=(r.median_s,)),
            entry(f"{r.gbps:.2f}", values=(r.gbps,)),
            entry(f"{r.pct_copy:.0f}%", values=(r.pct_copy,)),
            entry(f"{r.pct_roof:.0f}% {r.binding[0]}", values=(r.pct_roof, r.binding)),
            entry(f"{sp:.2f}", values=(sp,)) if sp else EMPTY,
            _verdict(r),
        )
    return sheet


def run_notes(records: list[RunRecord], ceilings: dict[str, Any] | None,
              skipped: list[str] | None = None) -> list[Note]:
    """The ceilings, what the case left out, then errors, unranked failures and noisy
    timings."""
    notes = []
    if ceilings and "matmul_gflops" in ceilings:
        mm = ", ".join(f"{d} {v['ceiling']:.1f}" for d, v in ceilings["matmul_gflops"].items())
        notes.append(note(f"ceilings: copy {ceilings['copy_gbps']:.1f} GB/s; "
                          f"matmul GFLOP/s: {mm}"))
    elif ceilings:
        exp = ", ".join(f"{d} {v:.2f}" for d, v in ceilings["exp_geps"].items())
        notes.append(note(f"ceilings: copy {ceilings['copy_gbps']:.1f} GB/s; "
                          f"exp G elements/s: {exp}"))
    notes += [note(Span("skipped", "warn"), f" {s}") for s in skipped or []]
    for r in records:
        gate = gate_label(r)
        shape = f"{list(r.shape)}{f' {gate}' if gate else ''}"  # as the file writes it
        if r.error is not None:
            notes.append(note(Span("ERROR", "fail"), f" {r.kernel} {shape}: {r.error}"))
        elif r.status == "FAIL" and not r.baseline:
            notes.append(note(Span("FAIL", "fail"), f" {r.kernel} {r.dtype}{f' {gate}' if gate else ''} (not ranked): "
                                                    f"{r.verify.reason}"))
        warning = r.timing.warning if r.timing is not None else None
        if warning:
            notes.append(note(Span("noisy", "warn"), f" {r.kernel} {shape}: {warning}"))
    seen: set[str] = set()  # a kernel failing verification fails it at every size: say it once
    return [n for n in notes if not (n.text in seen or seen.add(n.text))]


def run_failures(records: list[RunRecord]) -> int:
    """Timed kernels (not the baseline) that raised or failed verification (RunRecord.failed)."""
    return sum(r.failed for r in records)


def render_run(records: list[RunRecord], ceilings: dict[str, Any] | None,
               console: Console) -> None:
    """Print one table per function, then the ceilings and what went wrong."""
    from elasticbench.harness.report.terminal import print_tables

    print_tables(run_sheets(records), run_notes(records, ceilings), console)
