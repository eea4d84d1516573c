"""Verification tables: per function, kernel x dtype -> worst ulp error, share of budget.

Works on the typed records alone, so a saved results file renders exactly like a live run.
`verify_sheets` is the tabulation every format shares; `render` prints it to a terminal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from elasticbench.harness.numerics.contract import Judging
from elasticbench.harness.numerics.dtypes import DTYPE_NAMES
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.report.failures import (
    EVERY_FAILURE,
    NoteOptions,
    as_float,
    failure_notes,
    no_output,
    warning_notes,
)
from elasticbench.harness.report.sheet import EMPTY, Column, Entry, Note, Sheet, Span, entry, note

LEGEND = ("contract: the accuracy contract that judged the kernel (wide: a 16-bit kernel "
          "computes in fp32 and rounds once; own: in its own format), with the run's budget "
          "scale where it is not 1 (own x4: the own budgets times 4) and, for attention, the "
          "causal convention where it is bottom_right; "
          "cells: worst error in ulps where the special values were right, that of the one "
          "element that used the largest share of its budget, absolute ('abs') where its "
          "exact value is 0 (and that share); "
          "failing cells: failed/cases, that worst error, then the cases that broke the "
          "special-value policy (special) and those where the kernel raised; special: the "
          "policy over all dtypes ('-': never judged)")


@dataclass
class Cell:
    """Everything the records of one (kernel, dtype) say, folded together."""

    cases: int = 0
    failed: int = 0
    special_failed: int = 0  # cases that broke the special-value policy
    special_judged: int = 0  # cases whose special values were judged at all
    raised: int = 0  # cases where the kernel raised
    no_result: int = 0  # cases with nothing to judge for another reason (crashed, timed out)
    measured: bool = False  # some case gave an error in ulps
    max_ulp: float = 0.0  # the worst error where the special-value policy held
    max_frac: float = 0.0
    # the element behind max_frac, as its record's `worst` gives it: a passing cell shows
    # its error and its share, so that both figures describe one element
    worst_figure: str = ""
    param_rel: dict[str, float] = field(default_factory=dict)  # backward: worst d<param>
    compile: list[dict[str, Any]] = field(default_factory=list)  # what compiling said, per case
    second_order: set[str] = field(default_factory=set)  # backward: the kernel's answers
    judged_by: set[str] = field(default_factory=set)  # contracts and scales of its cases

    def add(self, r: VerifyRecord) -> None:
        self.cases += 1
        self.judged_by.add(judged_by(r))
        if r.second_order:
            self.second_order.add(r.second_order)
        if r.compile:
            self.compile.append(r.compile)
        for name, p in (r.dparams or {}).items():
            if p.get("expected") != "nan":
                self.param_rel[name] = max(self.param_rel.get(name, 0.0), as_float(p.get("rel_err")))
        if r.max_ulp is not None:
            self.measured = True
        self.max_ulp = max(self.max_ulp, as_float(r.max_ulp))
        frac = as_float(r.max_budget_frac)
        if r.max_ulp is not None and (frac > self.max_frac or not self.worst_figure):
            self.worst_figure = element_figure(r)
        self.max_frac = max(self.max_frac, frac)
        if r.special_ok is not None:
            self.special_judged += 1
        if not r.passed:
            self.failed += 1
            if r.special_ok is False:
                self.special_failed += 1
            if r.raised:
                self.raised += 1
            elif no_output(r):
                self.no_result += 1


@dataclass
class Summary:
    cells: dict[str, dict[str, dict[str, Cell]]] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(c.failed for f in self.cells.values() for k in f.values() for c in k.values())

    @property
    def cases(self) -> int:
        return sum(c.cases for f in self.cells.values() for k in f.values() for c in k.values())

    def line(self) -> str:
        """The one-line verdict: cases, passed, failed."""
        return f"{self.cases} cases, {self.cases - self.failed} passed, {self.failed} failed"


def group_of(r: VerifyRecord) -> str:
    """The table a record belongs to: its function, "<function> (bwd)" for backward."""
    return r.function if r.mode == "fwd" else f"{r.function} (bwd)"


def summarize(records: Iterable[VerifyRecord]) -> Summary:
    s = Summary()
    for r in records:
        cell = (
            s.cells.setdefault(group_of(r), {})
            .setdefault(r.kernel, {})
            .setdefault(r.dtype, Cell())
        )
        cell.add(r)
    return s


def judged_by(r: VerifyRecord) -> str:
    """The contract and budget scale that judged a record: 'wide', 'own', 'own x4'; an
    attention kernel judged bottom-right adds it ('own bottom_right')."""
    judged = Judging(r.accuracy, r.budget_scale).describe()
    return f"{judged} bottom_right" if r.causal == "bottom_right" else judged


def describe_case(r: VerifyRecord) -> str:
    params = " ".join(f"{k}={v:g}" for k, v in r.params.items())
    shape = "x".join(str(v) for v in r.shape)
    return f"{r.input} {shape} {r.dtype} seed={r.seed} {params}".strip()


def element_figure(r: VerifyRecord) -> str:
    """The error of the element that used the largest share of r's budget: in ulps, or
    absolute ("abs") where its exact value is 0 (verify/check.py element_error); a record
    without it (an older file) gives its largest error in ulps."""
    w = r.worst or {}
    if isinstance(w.get("ulp"), float):
        return f"{w['ulp']:.3g}"
    if isinstance(w.get("abs_err"), float):
        return f"{w['abs_err']:.2g} abs"
    return f"{as_float(r.max_ulp):.3g}"


def _cell_entry(c: Cell) -> Entry:
    values = (c.max_ulp if c.measured else None, c.max_frac if c.measured else None, c.failed,
              c.cases, c.special_failed, c.raised)
    if c.failed:
        parts = [f"{c.max_ulp:.3g} ulp"] if c.measured else []
        parts += [f"{n} {what}" for n, what in ((c.special_failed, "special"),
                                                (c.raised, "raised"),
                                                (c.no_result, "no result")) if n]
        return entry(f"{c.failed}/{c.cases} failed", "fail", values=values,
                     more=[Span(": " + ", ".join(parts))] if parts else [])
    # the machine-readable values stay the maxima of their columns (max ulp, budget share)
    return entry(c.worst_figure or f"{c.max_ulp:.3g}", values=values,
                 more=[Span(f" ({100 * c.max_frac:.0f}%)", "dim")])


def _special_entry(cells: list[Cell]) -> Entry:
    if any(c.special_failed for c in cells):
        return entry("FAIL", "bad")
    return entry("ok", "ok") if any(c.special_judged for c in cells) else entry("-", "dim")


def verify_sheets(summary: Summary) -> list[Sheet]:
    """One sheet per function (and per function backward): kernel x dtype."""
    sheets = []
    for function, kernels in summary.cells.items():
        dtypes = [d for d in DTYPE_NAMES if any(d in k for k in kernels.values())]
        what = "worst dx error" if function.endswith("(bwd)") else "worst error"
        columns = [Column("kernel", wrap=False), Column("contract", wrap=False)]
        columns += [Column(d, (f"{d} max ulp", f"{d} budget share", f"{d} failed", f"{d} cases",
                               f"{d} special failed", f"{d} raised"),
                           align="right") for d in dtypes]
        param_names = sorted({n for k in kernels.values() for c in k.values()
                              for n in c.param_rel})
        if param_names:
            columns.append(Column("worst rel. " + ", ".join(f"d{n}" for n in param_names),
                                  tuple(f"worst rel d{n}" for n in param_names), align="right"))
        orders = any(c.second_order for k in kernels.values() for c in k.values())
        if orders:
            columns.append(Column("2nd order", ("second order",), align="center"))
        columns += [Column("special", align="center", wrap=False),
                    Column("verdict", align="center", wrap=False)]
        sheet = Sheet(function, f"{function}: {what} in ulps (share of budget)", columns,
                      caption=LEGEND)
        for kernel, by_dtype in kernels.items():
            cells = [by_dtype.get(d) for d in dtypes]
            failed = sum(c.failed for c in by_dtype.values())
            params = []
            if param_names:
                worst = [max(c.param_rel.get(n, 0.0) for c in by_dtype.values())
                         for n in param_names]
                params = [entry(" ".join(f"{w:.2g}" for w in worst), values=worst)]
            if orders:
                said = sorted({a for c in by_dtype.values() for a in c.second_order})
                params.append(entry(", ".join(said) or "-", values=(", ".join(said),)))
            judging = sorted({j for c in by_dtype.values() for j in c.judged_by})
            sheet.add(
                entry(kernel), entry(", ".join(judging), "dim"),
                *[_cell_entry(c) if c else EMPTY for c in cells],
                *params,
                _special_entry(list(by_dtype.values())),
                entry("FAIL", "fail") if failed else entry("pass", "pass"),
            )
        sheets.append(sheet)
    return sheets


def _compile_line(checks: list[dict[str, Any]]) -> tuple[Span, str]:
    """Whether a (kernel, dtype) compiles for the GPUs, folded over its cases: registers and
    spills of each launched kernel, or the first compiler message, or why it was not checked."""
    launches = [c for check in checks for c in check["launches"]]
    archs = ", ".join(f"sm_{a}" for a in dict.fromkeys(c["arch"] for c in launches))
    bad = next((c for c in launches if c["error"]), None)
    if bad is not None:  # the failure note says why
        return Span("DOES NOT COMPILE", "fail"), f" for sm_{bad['arch']} (see its failure)"
    if not launches:
        return Span("compile not checked", "dim"), f": {checks[0]['error']}"
    parts = []
    for name in dict.fromkeys(c["launch"] for c in launches):
        mine = [c for c in launches if c["launch"] == name]
        lo, hi = min(c["regs"] for c in mine), max(c["regs"] for c in mine)
        spills = max(c["spill_bytes"] for c in mine)
        parts.append(f"{name} {lo if lo == hi else f'{lo}-{hi}'} registers, "
                     + (f"{spills} bytes of spills per thread" if spills else "no spills"))
    return Span("compiles", "ok"), f" for {archs}: " + "; ".join(parts)


def compile_notes(summary: Summary) -> list[Note]:
    """For each (kernel, dtype) whose backend compiled it for a GPU: what the compiler said."""
    notes = []
    for group, kernels in summary.cells.items():
        mode = " bwd" if group.endswith("(bwd)") else ""
        for kernel, by_dtype in kernels.items():
            for dtype, cell in by_dtype.items():
                if cell.compile:
                    head, text = _compile_line(cell.compile)
                    notes.append(note(head, f" {kernel}{mode} {dtype}{text}"))
    return notes


def verify_notes(records: list[VerifyRecord], summary: Summary, header: dict[str, Any],
                 options: NoteOptions = EVERY_FAILURE) -> list[Note]:
    """Every failing case (grouped, worst first), what compiling said, what kernels warned."""
    return (failure_notes(records, header, options) + compile_notes(summary)
            + warning_notes(records))


def render(records: list[VerifyRecord], console: Console,
           header: dict[str, Any] | None = None) -> Summary:
    """Print one table per function, then every failing case, what compiling said and what
    the kernels warned."""
    from elasticbench.harness.report.terminal import print_tables

    summary = summarize(records)
    print_tables(verify_sheets(summary), verify_notes(records, summary, header or {}), console)
    return summary
