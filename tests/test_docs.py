"""The project stands alone: its citations point into its own docs, and every doc is listed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("elasticbench", "kernels", "tests", "cases", "examples", "docs", "scripts")
TEXT = (".py", ".md", ".toml", ".yml", ".txt")
CITATION = re.compile(r"docs/([a-z0-9_-]+)\.md(?: sections? (\d+)(?:-(\d+))?)?")


def _files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]
    for folder in SOURCES:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in TEXT and p.is_file()]
    return files


def test_nothing_cites_notes_outside_the_repository() -> None:
    private = "DESIGN" + ".md"  # spelled apart so that this file does not cite it
    cited = [str(p.relative_to(ROOT)) for p in _files() if private in p.read_text()]
    assert not cited, f"cite docs/ instead of {private} in: {', '.join(cited)}"


def test_every_cited_doc_and_section_exists() -> None:
    broken = []
    for path in _files():
        for found in CITATION.finditer(path.read_text()):
            doc = ROOT / "docs" / f"{found[1]}.md"
            if not doc.is_file():
                broken.append(f"{path.relative_to(ROOT)}: {found[0]} (no such doc)")
                continue
            if found[2]:
                headings = set(re.findall(r"^## (\d+)\. ", doc.read_text(), re.MULTILINE))
                wanted = range(int(found[2]), int(found[3] or found[2]) + 1)
                missing = [str(n) for n in wanted if str(n) not in headings]
                if missing:
                    broken.append(f"{path.relative_to(ROOT)}: {found[0]} (no '## {missing[0]}.')")
    assert not broken, "\n".join(broken)


def test_readme_lists_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    unlisted = [p.name for p in sorted((ROOT / "docs").glob("*.md"))
                if f"[docs/{p.name}](docs/{p.name})" not in readme]
    assert not unlisted, f"add a row to README's Documentation table for: {', '.join(unlisted)}"
