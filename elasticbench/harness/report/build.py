"""From results files to Sections: load and check each file, then tabulate its records.

Nothing is re-run: a report is made from the records and the header alone.
"""

from __future__ import annotations

from typing import Any

from elasticbench.harness.records import ResultsFile, load_results
from elasticbench.harness.report.failures import EVERY_FAILURE, NoteOptions
from elasticbench.harness.report.run_table import run_failures, run_notes, run_sheets
from elasticbench.harness.report.sheet import Section
from elasticbench.harness.report.verify_table import summarize, verify_notes, verify_sheets


def load(path: str) -> ResultsFile:
    """Read and check one results file, each run record with every field its tables are drawn
    from (RunRecord.check_measured); ResultsFileError names the first problem."""
    return load_results(path, measured=True)


def _machine(doc: dict[str, Any]) -> str:
    m = doc.get("machine") or {}
    text = str(m.get("cpu") or "")
    if m.get("cores"):
        text += f", {m['cores']} cores"
    if m.get("gpu"):
        gpu = m["gpu"]
        text += f", {gpu.get('name', gpu) if isinstance(gpu, dict) else gpu}"
    return text


def section(results: ResultsFile, options: NoteOptions = EVERY_FAILURE) -> Section:
    """The tables, notes and summary line of one results file (options: how much of each
    failure the notes show)."""
    doc = results.doc
    about = {"created": doc.get("created"), "commit": doc.get("commit"),
             "machine": _machine(doc), "complete": doc.get("complete"),
             "case": doc.get("case_name")}
    records = results.records
    if results.kind == "verify":
        summary = summarize(records)
        return Section(results.source, "verify", about, verify_sheets(summary),
                       verify_notes(records, summary, doc, options), summary.line(),
                       summary.failed)
    failed = run_failures(records)
    kernels = len({r.kernel for r in records})
    line = f"{len(records)} timings of {kernels} kernels, {failed} failed verification or raised"
    return Section(results.source, "run", about, run_sheets(records),
                   run_notes(records, doc.get("ceilings"), doc.get("skipped")), line, failed)
