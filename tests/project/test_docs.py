"""The project stands alone: its citations point into its own docs, and every doc is listed."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
    unlisted = [name for p in sorted((ROOT / "docs").rglob("*.md"))
                if f"({(name := str(p.relative_to(ROOT)))})" not in readme]
    assert not unlisted, f"add a link in README's Documentation part to: {', '.join(unlisted)}"


# The user's guide (docs/guide/): the environment table, the generated CLI page, links.

# The variables the package reads are elasticbench.settings' table; besides them the table
# lists the one the native kernels read themselves and those only the tests read.
NATIVE_ONLY = {"ELASTICBENCH_CPP_ISA": ROOT / "kernels" / "cpp" / "cpu.cpp"}
TESTS_ONLY = {"ELASTICBENCH_PROPERTY_ELEMENTS", "ELASTICBENCH_ATTENTION_PROPERTY_ELEMENTS",
              "ELASTICBENCH_OTHER_TRITON", "ELASTICBENCH_TEST_TRITON_PATHS"}
CODE = ("elasticbench", "kernels", "scripts", "tests")
CODE_TEXT = (".py", ".sh", ".cpp", ".h")
# a name a test makes up to show that an unknown variable is ignored (tests/library/test_launches.py)
NOT_READ = {"ELASTICBENCH_TRITONX"}
VARIABLE = re.compile(r"ELASTICBENCH_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_])")


def _variables_named(folders: tuple[str, ...] = CODE) -> set[str]:
    """Every ELASTICBENCH_* name written in the code, its tests and CI (a prefix such as
    `ELASTICBENCH_TRITON_*` is not a name)."""
    paths = [ROOT / ".ci" / "run", ROOT / "Makefile"]
    for folder in folders:
        paths += [p for p in (ROOT / folder).rglob("*") if p.suffix in CODE_TEXT and p.is_file()
                  and p != Path(__file__).resolve()]  # this file's examples are no reads
    names = {m[0] for p in paths if p.is_file() for m in VARIABLE.finditer(p.read_text())}
    return names - NOT_READ


def _variables_listed() -> set[str]:
    """The variables docs/guide/environment.md's table has a row for."""
    text = (ROOT / "docs" / "guide" / "environment.md").read_text()
    return set(re.findall(r"^\| `(ELASTICBENCH_[A-Z0-9_]+)` \|", text, re.MULTILINE))


def test_the_environment_table_is_the_settings_table() -> None:
    from elasticbench.settings import VARIABLES

    listed, known = _variables_listed(), set(VARIABLES) | set(NATIVE_ONLY) | TESTS_ONLY
    assert not known - listed, f"docs/guide/environment.md lacks rows for: {sorted(known - listed)}"
    assert not listed - known, f"no setting reads these: {sorted(listed - known)}"
    for name, source in NATIVE_ONLY.items():
        assert name in source.read_text(), f"{source} no longer reads {name}"
    assert _variables_named(("tests",)) >= TESTS_ONLY, "a tests-only variable no test reads"


def test_every_variable_named_in_the_code_is_listed() -> None:
    """A script or test that names a variable no row lists (a new one, or a typo)."""
    missing = _variables_named() - _variables_listed()
    assert not missing, f"add rows to docs/guide/environment.md for: {sorted(missing)}"


def test_the_environment_check_sees_a_missing_row() -> None:
    from elasticbench.settings import VARIABLES

    assert "ELASTICBENCH_CACHE_MB" in set(VARIABLES) & _variables_named() & _variables_listed()
    assert "ELASTICBENCH_NOWHERE" not in _variables_listed()


def _script(name: str):
    """A module of scripts/ loaded by path (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_page_is_current() -> None:
    docs_cli = _script("docs_cli")
    page = (ROOT / "docs" / "guide" / "cli.md").read_text()
    assert page == docs_cli.render(), "docs/guide/cli.md is not current: run scripts/docs_cli.py"
    assert "## `elasticbench verify`" in page and "--mode fwd|bwd|both" in page


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of a markdown file whose file (or #heading) does not exist."""
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            broken.append(f"{path.relative_to(root)}: {target}")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            broken.append(f"{path.relative_to(root)}: {target} (no such heading)")
    return broken


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings: lower case, punctuation dropped,
    spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_resolves() -> None:
    broken = [b for path in _docs() for b in broken_links(path)]
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](page.md#top) [gone](nowhere.md) [bad](#bottom) [web](https://x.y)\n")
    assert broken_links(page, tmp_path) == ["page.md: nowhere.md",
                                            "page.md: #bottom (no such heading)"]


def test_the_readme_is_at_most_10_kb_and_has_no_dated_measurement() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 10 * 1024
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", readme)
    assert "make test" in readme


def test_the_docs_tables_are_generated_from_their_results_files() -> None:
    docs_tables = _script("docs_tables")
    assert not docs_tables.stale(), "a doc's table is not current: run scripts/docs_tables.py"
    shown = (ROOT / "docs" / "numerics.md").read_text()
    assert "<!-- table: results/verify-speed/native-sweeps.json -->" in shown


def test_a_table_block_is_rewritten_from_its_file(tmp_path: Path) -> None:
    docs_tables = _script("docs_tables")
    table = docs_tables.ROOT / "results" / "verify-speed" / "native-sweeps.json"
    block = f"<!-- table: {table.relative_to(docs_tables.ROOT)} -->\nold figures\n<!-- end table -->"
    new = docs_tables.render_doc(f"before\n{block}\nafter\n")
    assert "old figures" not in new
    assert "|  | 74b0fe2 | native sweeps |" in new and "measured 2026-11-27" in new
    assert new.startswith("before\n") and new.endswith("<!-- end table -->\nafter\n")


DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def dated_prose(text: str) -> list[str]:
    """The lines of a doc that carry a date outside its generated table blocks (a dated
    measurement belongs in results/, shown through scripts/docs_tables.py)."""
    docs_tables = _script("docs_tables")
    prose = docs_tables.BLOCK.sub(lambda m: m[1] + m[4], text)
    return [line for line in prose.splitlines() if DATE.search(line)]


def test_no_dated_measurement_in_the_docs_prose() -> None:
    changelog = ROOT / "docs" / "guide" / "CHANGELOG.md"
    dated = [f"{p.relative_to(ROOT)}: {line.strip()[:80]}"
             for p in sorted((ROOT / "docs").rglob("*.md")) if p != changelog
             for line in dated_prose(p.read_text())]
    assert not dated, "move dated measurements to results/ (docs/guide/CHANGELOG.md):\n" + \
        "\n".join(dated)


def test_the_date_check_skips_generated_tables_only() -> None:
    block = "<!-- table: results/x.json -->\nmeasured 2026-11-27\n<!-- end table -->"
    assert dated_prose(f"intro\n{block}\nafter\n") == []
    assert dated_prose(f"measured 2026-11-27 on this machine\n{block}\n") == [
        "measured 2026-11-27 on this machine"]
