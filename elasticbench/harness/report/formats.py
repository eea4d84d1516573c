"""Sections as documents: markdown (pull requests), CSV (spreadsheets), JSON (programs) and
one self-contained HTML page (tables, notes and plots embedded as base64 PNG).

Every format reads the same Sheets, so they always agree with the terminal tables.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from typing import Any

from elasticbench.harness.report.plots import Plot
from elasticbench.harness.report.sheet import Entry, Note, Section, Sheet, Span
from elasticbench.harness.report.terminal import about_line

SCHEMA = "elasticbench.report/1"
FOLD_NOTES = 5  # more notes than this go into a collapsed <details> block


# ---------------------------------------------------------------- markdown

def _md_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")


def _md_spans(spans: tuple[Span, ...]) -> str:
    out = []
    for s in spans:
        if s.tag == "code":
            out.append(f"`{s.text}`")
        elif s.tag in ("fail", "bad") and s.text.strip():
            out.append(f"**{_md_escape(s.text)}**")
        else:
            out.append(_md_escape(s.text))
    return "".join(out)


def _md_table(sheet: Sheet) -> list[str]:
    align = {"left": ":---", "right": "---:", "center": ":---:"}
    lines = [f"**{_md_escape(sheet.title)}**", "",
             "| " + " | ".join(_md_escape(c.header) for c in sheet.columns) + " |",
             "|" + "|".join(align[c.align] for c in sheet.columns) + "|"]
    lines += ["| " + " | ".join(_md_spans(e.spans) for e in row) + " |" for row in sheet.rows]
    if sheet.caption:
        lines += ["", f"_{_md_escape(sheet.caption)}_"]
    return [*lines, ""]


def _md_note(n: Note) -> list[str]:
    return [f"- {_md_spans(n.head)}", *(f"  - {_md_spans(d)}" for d in n.details)]


def to_markdown(sections: list[Section], images: list[tuple[str, str]] = ()) -> str:
    """GitHub-flavoured markdown: a heading per results file, a pipe table per sheet, then
    links to the plots written beside it (alt text, path)."""
    lines: list[str] = []
    for s in sections:
        lines += [f"## {_md_escape(s.source)}", "", f"{_md_escape(about_line(s))}", ""]
        for sheet in s.sheets:
            lines += _md_table(sheet)
        if s.notes:
            body = [line for n in s.notes for line in _md_note(n)]
            if len(s.notes) > FOLD_NOTES:
                lines += [f"<details><summary>{len(s.notes)} notes</summary>", "", *body, "",
                          "</details>"]
            else:
                lines += body
            lines.append("")
        lines += [f"**{_md_escape(s.summary)}**", ""]
    for alt, path in images:
        lines += [f"![{alt}]({path})", ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- CSV and JSON

def _plain(v: Any) -> Any:
    """A raw value as strict JSON: non-finite floats become 'inf', '-inf', 'nan'."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def csv_fields(sections: list[Section]) -> list[str]:
    """The header of the CSV: file, table, then every field in first-seen order."""
    fields: dict[str, None] = {"file": None, "table": None}
    for s in sections:
        for sheet in s.sheets:
            for col in sheet.columns:
                fields.update(dict.fromkeys(col.names))
    return list(fields)


def to_csv(sections: list[Section]) -> str:
    """One header row, then a row per table row of every results file; blanks where a
    table has no such field. Numbers are raw (seconds, GB/s, ulps), not formatted."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=csv_fields(sections), lineterminator="\n")
    writer.writeheader()
    for s in sections:
        for sheet in s.sheets:
            for rec in sheet.records():
                writer.writerow({"file": s.source, "table": sheet.name,
                                 **{k: ("" if v is None else v) for k, v in rec.items()}})
    return buf.getvalue()


def _json_note(n: Note) -> dict[str, Any]:
    return {"text": n.text, "details": ["".join(s.text for s in d) for d in n.details]}


def report_doc(sections: list[Section]) -> dict[str, Any]:
    """The report as plain data: per results file, its tables as rows of raw values."""
    return {
        "schema": SCHEMA,
        "files": [{
            "source": s.source, "kind": s.kind, "about": s.about, "summary": s.summary,
            "failed": s.failed,
            "tables": [{
                "name": sh.name, "title": sh.title, "caption": sh.caption,
                "columns": [{"header": c.header, "fields": list(c.names)} for c in sh.columns],
                "rows": [{k: _plain(v) for k, v in rec.items()} for rec in sh.records()],
            } for sh in s.sheets],
            "notes": [_json_note(n) for n in s.notes],
        } for s in sections],
    }


def to_json(sections: list[Section]) -> str:
    return json.dumps(report_doc(sections), indent=1, allow_nan=False) + "\n"


# ---------------------------------------------------------------- HTML

CSS = """
:root { color-scheme: light dark; --fg: #1b1f24; --bg: #ffffff; --mute: #667085;
  --rule: #d0d7de; --head: #f6f8fa; --pass: #1a7f37; --fail: #cf222e; --warn: #9a6700; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --mute: #8b949e;
  --rule: #30363d; --head: #161b22; --pass: #3fb950; --fail: #f85149; --warn: #d29922; } }
body { font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg);
  max-width: 1200px; margin: 2rem auto; padding: 0 1rem; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; border-bottom: 1px solid var(--rule); }
.about, caption.note, .caption { color: var(--mute); font-size: 0.9rem; }
.scroll { overflow-x: auto; margin: 0.5rem 0 1.2rem; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: 0.3rem 0; }
th, td { border: 1px solid var(--rule); padding: 0.25rem 0.6rem; white-space: nowrap; }
th { background: var(--head); }
td.left { text-align: left; } td.right { text-align: right; } td.center { text-align: center; }
td:first-child { font-weight: 600; }
.pass { color: var(--pass); font-weight: 600; } .ok { color: var(--pass); }
.fail { color: var(--fail); font-weight: 600; } .bad { color: var(--fail); }
.warn { color: var(--warn); } .dim { color: var(--mute); }
code { font-size: 0.85rem; }
ul.notes { padding-left: 1.2rem; } ul.notes ul { color: var(--mute); }
figure { margin: 1rem 0 2rem; } figure img { max-width: 100%; height: auto;
  background: #fff; border: 1px solid var(--rule); }
figcaption { color: var(--mute); font-size: 0.9rem; }
"""


def _html_spans(spans: tuple[Span, ...]) -> str:
    out = []
    for s in spans:
        t = html.escape(s.text)
        if s.tag == "code":
            out.append(f"<code>{t}</code>")
        elif s.tag:
            out.append(f'<span class="{s.tag}">{t}</span>')
        else:
            out.append(t)
    return "".join(out)


def _html_cell(e: Entry, align: str) -> str:
    return f'<td class="{align}">{_html_spans(e.spans)}</td>'


def _html_table(sheet: Sheet) -> str:
    head = "".join(f"<th>{html.escape(c.header)}</th>" for c in sheet.columns)
    rows = "\n".join("<tr>" + "".join(_html_cell(e, c.align)
                                      for c, e in zip(sheet.columns, row, strict=True)) + "</tr>"
                     for row in sheet.rows)
    caption = f'<p class="caption">{html.escape(sheet.caption)}</p>' if sheet.caption else ""
    return (f'<div class="scroll"><table data-table="{html.escape(sheet.name)}">'
            f"<caption>{html.escape(sheet.title)}</caption>\n<thead><tr>{head}</tr></thead>\n"
            f"<tbody>\n{rows}\n</tbody></table>{caption}</div>")


def _html_notes(notes: list[Note]) -> str:
    items = []
    for n in notes:
        sub = "".join(f"<li>{_html_spans(d)}</li>" for d in n.details)
        items.append(f"<li>{_html_spans(n.head)}" + (f"<ul>{sub}</ul>" if sub else "") + "</li>")
    if not items:
        return ""
    body = '<ul class="notes">\n' + "\n".join(items) + "\n</ul>"
    if len(items) > FOLD_NOTES:
        return f"<details><summary>{len(items)} notes</summary>\n{body}\n</details>"
    return body


def _html_plot(p: Plot) -> str:
    data = base64.b64encode(p.png).decode("ascii")
    return (f'<figure id="plot-{html.escape(p.name)}"><img alt="{html.escape(p.alt)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{html.escape(p.title)}'
            f"</figcaption></figure>")


def to_html(sections: list[Section], plots: list[Plot], plot_note: str = "") -> str:
    """One page with nothing to fetch: inline CSS, tables, notes, plots as data: URIs."""
    title = "elasticbench report: " + ", ".join(s.source for s in sections)
    body = [f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        body += [f"<h2>{html.escape(s.source)}</h2>",
                 f'<p class="about">{html.escape(about_line(s))}</p>',
                 *(_html_table(sh) for sh in s.sheets), _html_notes(s.notes),
                 f"<p><strong>{html.escape(s.summary)}</strong></p>"]
    if plots or plot_note:
        body.append("<h2>Plots</h2>")
    if plot_note:
        body.append(f'<p class="about">{html.escape(plot_note)}</p>')
    body += [_html_plot(p) for p in plots]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(b for b in body if b) + "\n</body>\n</html>\n")
