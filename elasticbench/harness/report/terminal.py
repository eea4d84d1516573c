"""Sheets and notes on a terminal, with rich.

Plain text (no control codes) when the output is not a terminal, no colour under NO_COLOR
(rich's own rules), and columns that fold rather than break on a narrow terminal. Output that
is not a terminal (a pipe, a file) is never wrapped, unless COLUMNS asks for a width.
A Terminal can be asked for the summary line alone (`--quiet`): the tables then print nothing.
"""

from __future__ import annotations

import os
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from elasticbench.harness.report.sheet import Entry, Note, Section, Sheet, Span

STYLES = {"pass": "bold green", "ok": "green", "fail": "bold red", "bad": "red",
          "warn": "yellow", "dim": "dim", "code": ""}


NO_WRAP = 1 << 15  # the width of output that is not a terminal: nothing is folded to fit


class Terminal(Console):
    """A rich console that also knows whether only the final summary line is wanted, and
    never wraps what it writes to a pipe or a file (a pasted command must stay whole)."""

    def __init__(self, *, summary_only: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.summary_only = summary_only
        if ("width" not in kwargs and not self.is_terminal
                and not os.environ.get("COLUMNS", "").strip().isdigit()):
            self.width = NO_WRAP


def wants_detail(console: Console) -> bool:
    """False when the user asked for the summary line alone."""
    return not getattr(console, "summary_only", False)


def text(spans: tuple[Span, ...]) -> Text:
    out = Text()
    for s in spans:
        out.append(s.text, STYLES.get(s.tag, ""))
    return out


def _cell(e: Entry) -> Text:
    return text(e.spans)


def rich_table(sheet: Sheet, columns: list[int] | None = None, *, part: str = "",
               fold_all: bool = False) -> Table:
    """A sheet (or some of its columns) as a rich Table, without its caption (print_tables
    prints that as a line of its own). Long cells wrap; with fold_all even names and
    verdicts may fold, for terminals too narrow for anything else."""
    cols = list(range(len(sheet.columns))) if columns is None else columns
    options: dict[str, Any] = {"title": sheet.title + part, "title_justify": "left"}
    if sheet.compact:
        options.update(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table = Table(**options)
    for i in cols:
        col = sheet.columns[i]
        table.add_column(col.header, justify=col.align, style="bold" if i == 0 else "",
                         no_wrap=not (col.wrap or fold_all), overflow="fold")
    for row in sheet.rows:
        table.add_row(*[_cell(row[i]) for i in cols])
    return table


def _min_width(console: Console, table: Table) -> int:
    # Measured unbounded: rich clamps a measurement to the width it is offered.
    return Measurement.get(console, console.options.update(max_width=1 << 16), table).minimum


def fit_tables(sheet: Sheet, console: Console) -> list[Table]:
    """The sheet as one table when it fits the console; else folded into several tables of
    consecutive columns, each repeating the first (kernel) column."""
    whole = rich_table(sheet)
    width = console.width
    if _min_width(console, whole) <= width or len(sheet.columns) <= 2:
        return [whole if _min_width(console, whole) <= width
                else rich_table(sheet, fold_all=True)]
    groups: list[list[int]] = []
    current = [0]
    for i in range(1, len(sheet.columns)):
        if len(current) > 1 and _min_width(console, rich_table(sheet, [*current, i])) > width:
            groups.append(current)
            current = [0]
        current.append(i)
    groups.append(current)
    tables = []
    for k, cols in enumerate(groups):
        part = f" ({k + 1}/{len(groups)})"
        t = rich_table(sheet, cols, part=part)
        if _min_width(console, t) > width:
            t = rich_table(sheet, cols, part=part, fold_all=True)
        tables.append(t)
    return tables


def print_tables(sheets: list[Sheet], notes: list[Note], console: Console) -> None:
    """Each sheet as a table, then each note and its indented details."""
    if not wants_detail(console):
        return
    for sheet in sheets:
        for table in fit_tables(sheet, console):
            console.print(table)
        if sheet.caption:
            console.print(Text(sheet.caption, style="dim"))
    for n in notes:
        console.print(text(n.head))
        for d in n.details:
            console.print(text((Span("  "), *d)))


def about_line(section: Section) -> str:
    """Where a results file came from, in one line."""
    a = section.about
    parts = [section.kind]
    if a.get("case"):
        parts.append(f"case {a['case']}")
    if a.get("created"):
        parts.append(str(a["created"]))
    if a.get("commit"):
        parts.append(f"commit {str(a['commit'])[:10]}")
    if a.get("machine"):
        parts.append(a["machine"])
    if a.get("complete") is False:
        parts.append("INCOMPLETE (interrupted)")
    return " · ".join(parts)


def print_sections(sections: list[Section], console: Console) -> None:
    """Each results file: a heading, its tables and notes, its summary line."""
    if not wants_detail(console):
        return
    for i, s in enumerate(sections):
        if i:
            console.print()
        if console.width >= NO_WRAP:  # a rule as wide as that would be one enormous line
            console.print(Text(f"── {s.source} ──", style="bold"))
        else:
            console.rule(Text(s.source, style="bold"), align="left")
        console.print(Text(about_line(s), style="dim"))
        print_tables(s.sheets, s.notes, console)
        console.print(Text(f"{s.source}: {s.summary}"))
