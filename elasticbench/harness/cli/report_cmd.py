"""`elasticbench report`: re-render saved runs and verifications from their records alone."""

from __future__ import annotations

import io
import os
from pathlib import Path

import click

from elasticbench.harness.cli.common import console, fail, failures_shown, note_options
from elasticbench.harness.records import ResultsFile, ResultsFileError, check_writable
from elasticbench.harness.report.build import load, section
from elasticbench.harness.report.formats import to_csv, to_html, to_json, to_markdown
from elasticbench.harness.report.plots import (
    INSTALL_HINT,
    Plot,
    PlotsUnavailable,
    plots_for,
    require_matplotlib,
)
from elasticbench.harness.report.sheet import Section
from elasticbench.harness.report.terminal import NO_WRAP, Terminal, print_sections, wants_detail

FORMATS = ("table", "markdown", "csv", "json", "html")


def _stem(results: ResultsFile, taken: set[str]) -> str:
    """A plot-name prefix for a results file, unique within this report."""
    stem = Path(results.source).stem or "results"
    name, i = stem, 2
    while name in taken:
        name, i = f"{stem}-{i}", i + 1
    taken.add(name)
    return name


def _plain_table(sections: list[Section]) -> str:
    """The terminal tables as plain text for a file: no control codes, nothing wrapped."""
    buf = io.StringIO()
    print_sections(sections, Terminal(file=buf, width=NO_WRAP, color_system=None,
                                      force_terminal=False, highlight=False))
    return buf.getvalue()


def _plots(loaded: list[ResultsFile], fmt: str, plot_dir: str | None
           ) -> tuple[list[Plot], str, list[str]]:
    """The files' plots when --plot or an HTML page wants them, written into plot_dir if
    given (exit 2 if they cannot be); the page's note when matplotlib is missing; what was
    written."""
    plots: list[Plot] = []
    plot_note = ""
    if plot_dir or fmt == "html":
        try:
            taken: set[str] = set()
            plots = [p for r in loaded for p in plots_for(_stem(r, taken), r)]
        except PlotsUnavailable:
            plot_note = f"No plots: {INSTALL_HINT}."
    written: list[str] = []
    if plot_dir:
        d = Path(plot_dir)
        try:
            d.mkdir(parents=True, exist_ok=True)
            for p in plots:
                (d / f"{p.name}.png").write_bytes(p.png)
        except OSError as e:
            fail(f"cannot write plots into {plot_dir}: {e.strerror or e}")
        written.append(f"{len(plots)} plots in {plot_dir}")
    return plots, plot_note, written


@click.command()
@click.argument("results", nargs=-1, required=True, metavar="RESULTS...")
@click.option("--format", "-F", "fmt", type=click.Choice(FORMATS), default="table",
              show_default=True, help="table (terminal), markdown, csv, json or html.")
@click.option("--output", "-o", "output", type=click.Path(dir_okay=False), metavar="PATH",
              help="Write the report here instead of standard output.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Also write the plots as PNG files into DIR (needs matplotlib).")
@note_options
def report(results: tuple[str, ...], fmt: str, output: str | None, plot_dir: str | None,
           failures: str, traceback: bool) -> None:
    """Render saved results files (verify or run, several at once) without re-running anything.

    The tables of `verify` and `run`, as terminal tables, markdown for pull requests, CSV for
    spreadsheets, JSON for programs, or one self-contained HTML page with the plots embedded.
    Exit code 0 when every file was rendered, 2 for a bad file or usage (one line).
    """
    if plot_dir:
        try:
            require_matplotlib()
        except PlotsUnavailable as e:
            fail(str(e))
    try:
        loaded = [load(p) for p in results]
    except ResultsFileError as e:
        fail(str(e))
    if output:
        try:
            check_writable(Path(output))
        except OSError as e:
            fail(f"cannot write report {output}: {e.strerror or e}")
    notes = failures_shown(failures, traceback)
    sections = [section(r, notes) for r in loaded]
    plots, plot_note, written = _plots(loaded, fmt, plot_dir)

    out = console()
    summary = "; ".join(f"{s.source}: {s.summary}" for s in sections)
    if fmt == "table" and not output:
        print_sections(sections, out)
    else:
        # Markdown links the PNGs relative to where the document is written.
        base = Path(output).resolve().parent if output else Path.cwd()
        images = [(p.alt, os.path.relpath(Path(plot_dir).resolve() / f"{p.name}.png", base))
                  for p in plots] if plot_dir else []
        text = {"table": lambda: _plain_table(sections),
                "markdown": lambda: to_markdown(sections, images),
                "csv": lambda: to_csv(sections),
                "json": lambda: to_json(sections),
                "html": lambda: to_html(sections, plots, plot_note)}[fmt]()
        if output:
            Path(output).write_text(text, encoding="utf-8")
            written.insert(0, f"{fmt} in {output}")
        else:
            click.echo(text, nl=False)
            # The document is standard output, so the summary line goes to standard error.
            out = console(stderr=True)
    line = summary + (f"; wrote {', '.join(written)}" if written else "")
    if wants_detail(out) and fmt == "table" and not output:
        out.print()
    out.print(line, markup=False, soft_wrap=True)
