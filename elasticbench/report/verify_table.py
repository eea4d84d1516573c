"""Verification tables: per function, kernel x dtype -> worst ulp error, share of budget.

Works on records alone, so a saved results file renders exactly like a live run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from ..numerics.dtypes import DTYPE_NAMES


@dataclass
class Cell:
    """Everything the records of one (kernel, dtype) say, folded together."""

    cases: int = 0
    failed: int = 0
    special_failed: int = 0
    max_ulp: float = 0.0
    max_frac: float = 0.0
    worst: dict[str, Any] | None = None  # the record with the largest budget fraction
    first_failure: dict[str, Any] | None = None

    def add(self, r: dict[str, Any]) -> None:
        self.cases += 1
        frac = _num(r.get("max_budget_frac"))
        self.max_ulp = max(self.max_ulp, _num(r.get("max_ulp")))
        if self.worst is None or frac > self.max_frac:
            self.max_frac = max(self.max_frac, frac)
            self.worst = r
        if not r["passed"]:
            self.failed += 1
            if r.get("special_ok") is False:
                self.special_failed += 1
            if self.first_failure is None or _num(r.get("max_budget_frac")) > _num(
                self.first_failure.get("max_budget_frac")
            ):
                self.first_failure = r


def _num(v: Any) -> float:
    if v is None:
        return 0.0
    if isinstance(v, str):  # 'inf' / 'nan' as stored in JSON
        return float("inf")
    return float(v)


@dataclass
class Summary:
    cells: dict[str, dict[str, dict[str, Cell]]] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return sum(c.failed for f in self.cells.values() for k in f.values() for c in k.values())

    @property
    def cases(self) -> int:
        return sum(c.cases for f in self.cells.values() for k in f.values() for c in k.values())


def summarize(records: Iterable[dict[str, Any]]) -> Summary:
    s = Summary()
    for r in records:
        cell = (
            s.cells.setdefault(r["function"], {})
            .setdefault(r["kernel"], {})
            .setdefault(r["dtype"], Cell())
        )
        cell.add(r)
    return s


def describe_case(r: dict[str, Any]) -> str:
    params = " ".join(f"{k}={v:g}" for k, v in r.get("params", {}).items())
    shape = "x".join(str(v) for v in r["shape"])
    return f"{r['input']} {shape} {r['dtype']} seed={r['seed']} {params}".strip()


def reproduce_command(r: dict[str, Any]) -> str:
    cmd = f"elasticbench verify --only {r['kernel']} --dtype {r['dtype']} --input {r['input']}"
    if r.get("source", "builtin") != "builtin":
        cmd += f" --kernel-file {r['source']}"
    return cmd


def _cell_text(c: Cell) -> str:
    if c.failed:
        return f"[bold red]{c.failed}/{c.cases} FAIL[/] {c.max_ulp:.3g}"
    return f"{c.max_ulp:.3g} [dim]({100 * c.max_frac:.0f}%)[/]"


def render(records: list[dict[str, Any]], console: Console) -> Summary:
    """Print one table per function and the worst failing input of each failing cell."""
    summary = summarize(records)
    for function, kernels in summary.cells.items():
        dtypes = [d for d in DTYPE_NAMES if any(d in k for k in kernels.values())]
        table = Table(
            title=f"{function}: worst error in ulps (share of budget)", title_justify="left"
        )
        table.add_column("kernel", style="bold", no_wrap=True)
        for d in dtypes:
            table.add_column(d, justify="right")
        table.add_column("special", justify="center", no_wrap=True)
        table.add_column("verdict", justify="center", no_wrap=True)
        for kernel, by_dtype in kernels.items():
            cells = [by_dtype.get(d) for d in dtypes]
            special_bad = sum(c.special_failed for c in by_dtype.values())
            failed = sum(c.failed for c in by_dtype.values())
            table.add_row(
                kernel,
                *[_cell_text(c) if c else "-" for c in cells],
                "[red]FAIL[/]" if special_bad else "[green]ok[/]",
                "[bold red]FAIL[/]" if failed else "[bold green]pass[/]",
            )
        console.print(table)
    failures = [
        (k, d, c)
        for kernels in summary.cells.values()
        for k, by in kernels.items()
        for d, c in by.items()
        if c.failed
    ]
    for kernel, dtype, cell in failures:
        r = cell.first_failure
        assert r is not None
        console.print(f"[bold red]FAIL[/] {kernel} {dtype}: {r['reason']}")
        console.print(f"  case: {describe_case(r)}")
        w = r.get("worst")
        if w:
            console.print(
                f"  at row {w['row']} index {w['index']}: input {w['input']!r}, "
                f"expected {w['expected']!r}, got {w['got']!r}"
                + (f" ({w['ulp']:.4g} ulp, allowed {w['allowed_ulp']:.4g})"
                   if isinstance(w.get("ulp"), float) and isinstance(w.get("allowed_ulp"), float)
                   else "")
            )
        console.print(f"  reproduce: {reproduce_command(r)}")
    return summary
