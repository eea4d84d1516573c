"""Write the measured tables the docs show from their results/ files.

    .venv/bin/python scripts/docs_tables.py           # rewrite every table in README.md, docs/
    .venv/bin/python scripts/docs_tables.py --check   # exit 1 if a table is not current

A doc shows a measurement as a block between two markers, naming its file:

    <!-- table: results/verify-speed/native-sweeps.json -->
    ...generated: a line saying when, where and how it was measured, then the table...
    <!-- end table -->

The JSON file holds `title`, `date`, `machine`, `command`, `conditions`, `columns` (the
header cells) and `rows` (lists of cells, as markdown). The doc's prose says what the
figures show; the figures and their date live only in results/ (docs/guide/CHANGELOG.md).
tests/project/test_docs.py fails when a block differs from what this script writes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- table: (\S+) -->\n)(.*?)(<!-- end table -->)", re.DOTALL)


class TableError(ValueError):
    """A results file a doc names that is missing or lacks a field."""


def render_table(path: Path) -> str:
    """The markdown a doc shows for one results file: the measurement's line, then the table."""
    if not path.is_file():
        raise TableError(f"{path}: no such results file")
    data = json.loads(path.read_text())
    missing = [k for k in ("title", "date", "machine", "command", "conditions", "columns",
                           "rows") if k not in data]
    if missing:
        raise TableError(f"{path}: missing {', '.join(missing)}")
    width = len(data["columns"])
    bad = [i for i, row in enumerate(data["rows"]) if len(row) != width]
    if bad:
        raise TableError(f"{path}: row {bad[0]} has not {width} cells")
    lines = [f"*{data['title']}*: measured {data['date']} on {data['machine']}; "
             f"`{data['command']}`; {data['conditions']} "
             f"(`{path.relative_to(ROOT)}`).", "",
             "| " + " | ".join(data["columns"]) + " |",
             "|" + "---|" * width]
    lines += ["| " + " | ".join(row) + " |" for row in data["rows"]]
    return "\n".join(lines) + "\n"


def render_doc(text: str) -> str:
    """The doc's text with every table block rewritten from its results file."""
    return BLOCK.sub(lambda m: m[1] + render_table(ROOT / m[2]) + m[4], text)


def docs() -> list[Path]:
    """The files whose table blocks this script writes."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def stale() -> list[Path]:
    """The docs whose tables differ from their results files."""
    return [p for p in docs() if render_doc(p.read_text()) != p.read_text()]


def main(argv: list[str]) -> int:
    """Rewrite the tables, or with --check list the stale docs; 1 if any, 2 for bad usage or
    a bad results file."""
    if argv not in ([], ["--check"]):
        print("usage: docs_tables.py [--check]", file=sys.stderr)
        return 2
    try:
        if argv == ["--check"]:
            late = stale()
            for path in late:
                print(f"{path.relative_to(ROOT)}: a table is not current: run scripts/docs_tables.py")
            return 1 if late else 0
        for path in docs():
            text = path.read_text()
            if (new := render_doc(text)) != text:
                path.write_text(new)
    except (TableError, json.JSONDecodeError) as e:
        print(f"docs_tables: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
