"""From results files to Sections: load and check each file, then tabulate its records.

Nothing is re-run: a report is made from the records and the header alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..records import RECORD_TYPES, ResultsFileError, read_results
from ..records.fields import timed_names
from .failures import EVERY_FAILURE, NoteOptions
from .run_table import run_failures, run_notes, run_sheets
from .sheet import Section
from .verify_table import summarize, verify_notes, verify_sheets

# The measured fields the run tables and plots are drawn from (a kernel that raised has none).
TIMED = timed_names(RECORD_TYPES["run"])


@dataclass
class Results:
    """One loaded results file."""

    source: str  # the path as given on the command line
    kind: str  # verify | run
    doc: dict[str, Any]

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.doc["records"]


def load(path: str) -> Results:
    """Read and check one results file; ResultsFileError names the first problem."""
    doc = read_results(Path(path))  # every record checked against its type
    kind = doc.get("kind") or doc["schema"].split(".")[1].split("/")[0]
    for i, r in enumerate(doc["records"]):
        missing = [k for k in TIMED if kind == "run" and "error" not in r and k not in r]
        if missing:
            raise ResultsFileError(f"results file {path}: record {i} ({r.get('kernel', '?')}) "
                                   f"lacks {', '.join(missing)}")
    return Results(path, kind, doc)


def _machine(doc: dict[str, Any]) -> str:
    m = doc.get("machine") or {}
    text = str(m.get("cpu") or "")
    if m.get("cores"):
        text += f", {m['cores']} cores"
    if m.get("gpu"):
        gpu = m["gpu"]
        text += f", {gpu.get('name', gpu) if isinstance(gpu, dict) else gpu}"
    return text


def section(results: Results, options: NoteOptions = EVERY_FAILURE) -> Section:
    """The tables, notes and summary line of one results file (options: how much of each
    failure the notes show)."""
    doc = results.doc
    about = {"created": doc.get("created"), "commit": doc.get("commit"),
             "machine": _machine(doc), "complete": doc.get("complete"),
             "case": doc.get("case_name")}
    if results.kind == "verify":
        summary = summarize(results.records)
        return Section(results.source, "verify", about, verify_sheets(summary),
                       verify_notes(results.records, summary, doc, options), summary.line(),
                       summary.failed)
    records = results.records
    failed = run_failures(records)
    kernels = len({r["kernel"] for r in records})
    line = f"{len(records)} timings of {kernels} kernels, {failed} failed verification or raised"
    return Section(results.source, "run", about, run_sheets(records),
                   run_notes(records, doc.get("ceilings"), doc.get("skipped")), line, failed)
