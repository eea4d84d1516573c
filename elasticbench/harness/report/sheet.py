"""The one tabulation step every format shares.

Records become Sheets: titled tables whose entries carry both what a person reads (text in
styled spans) and what a program reads (the raw values, one per named field of the column).
The terminal, markdown and HTML show the spans; CSV and JSON write the values. Styles are
semantic tags ("pass", "fail", ...) that each renderer maps to its own look.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Span:
    """A run of text with one semantic style tag ("" for plain)."""

    text: str
    tag: str = ""


@dataclass(frozen=True)
class Entry:
    """One table cell: styled text for people, raw values (one per column field) for programs."""

    spans: tuple[Span, ...]
    values: tuple[Any, ...]

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.spans)


def entry(text: str, tag: str = "", *, values: Iterable[Any] | None = None,
          more: Iterable[Span] = ()) -> Entry:
    """An entry reading `text` (then `more`); its raw values default to the text itself."""
    return Entry((Span(text, tag), *more), (text,) if values is None else tuple(values))


EMPTY = entry("-", values=())  # no measurement: every field of the column is left blank


@dataclass(frozen=True)
class Column:
    """A column: its header, the raw fields it holds, how it aligns, whether it may wrap."""

    header: str
    fields: tuple[str, ...] = ()
    align: str = "left"  # left | right | center
    wrap: bool = True  # False for short tokens (kernel names, verdicts) that must stay whole

    @property
    def names(self) -> tuple[str, ...]:
        return self.fields or (self.header,)


@dataclass
class Sheet:
    """One titled table: a function's verification, or a function's timings."""

    name: str  # short and stable, e.g. "elastic (bwd)"; the CSV/JSON table key
    title: str
    columns: list[Column]
    rows: list[list[Entry]] = field(default_factory=list)
    caption: str = ""
    compact: bool = False  # a wide table: light rules, no outer padding

    def add(self, *entries: Entry) -> None:
        if len(entries) != len(self.columns):
            raise ValueError(f"{self.name}: {len(entries)} entries for {len(self.columns)} columns")
        self.rows.append(list(entries))

    def records(self) -> list[dict[str, Any]]:
        """The rows as {field: raw value}; fields an entry leaves out are absent."""
        out = []
        for row in self.rows:
            d: dict[str, Any] = {}
            for col, e in zip(self.columns, row, strict=True):
                d.update(zip(col.names, e.values, strict=False))
            out.append(d)
        return out


@dataclass(frozen=True)
class Note:
    """A line under the tables (a failure, a ceiling, a warning) and its indented details."""

    head: tuple[Span, ...]
    details: tuple[tuple[Span, ...], ...] = ()

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.head)


def note(*head: Span | str, details: Iterable[Iterable[Span | str]] = ()) -> Note:
    """A Note from spans or plain strings."""
    def spans(parts: Iterable[Span | str]) -> tuple[Span, ...]:
        return tuple(p if isinstance(p, Span) else Span(p) for p in parts)

    return Note(spans(head), tuple(spans(d) for d in details))


@dataclass
class Section:
    """Everything one results file says: where it came from, its tables, notes, summary."""

    source: str  # the path as given
    kind: str  # verify | run
    about: dict[str, Any]  # created, commit, machine, complete: the header, abridged
    sheets: list[Sheet]
    notes: list[Note]
    summary: str  # one line: counts and verdicts
    failed: int = 0
