"""Pieces every subcommand shares: one-line errors, name lists, kernel files."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from elasticbench.harness.backends import BACKEND_NAMES, get_backend
from elasticbench.harness.numerics.dtypes import DTYPE_NAMES
from elasticbench.harness.numerics.truth.cache import TruthError, TruthStats
from elasticbench.harness.records import ResultsFile
from elasticbench.harness.registry import (
    KernelFileError,
    KernelSpec,
    list_kernels,
    load_kernel_file,
    select_kernels,
)
from elasticbench.harness.report.build import section
from elasticbench.harness.report.failures import EVERY_FAILURE, NoteOptions
from elasticbench.harness.report.terminal import Terminal, print_tables
from elasticbench.harness.session import Job, Session, SessionError
from elasticbench.harness.shards import parse_shard
from elasticbench.harness.verify.matrix import builtin_case

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def fail(message: str) -> NoReturn:
    """Print one line naming the problem and exit with the usage code."""
    first = " ".join(str(message).split())
    click.echo(f"elasticbench: error: {first}", err=True)
    sys.exit(EXIT_USAGE)


def case_path(case_file: str | None, quick: bool, quick_case: str, default_case: str) -> Path:
    """The --case file, else the built-in quick or default case (--case with --quick: exit 2)."""
    if case_file and quick:
        fail("--case and --quick cannot be used together")
    return Path(case_file) if case_file else builtin_case(quick_case if quick else default_case)


def split_names(values: Iterable[str]) -> list[str]:
    """Names given as repeated options and/or comma-separated lists, in order, deduplicated."""
    out: list[str] = []
    for v in values:
        for name in v.split(","):
            name = name.strip()
            if name and name not in out:
                out.append(name)
    return out


def choose_kernels_by_mode(
    functions: list[str],
    backends: list[str],
    only: list[str],
    kernel_files: Iterable[str],
    modes: Iterable[str] = ("fwd",),
) -> dict[str, list[KernelSpec]]:
    """Load kernel files, then select kernels for each mode. With kernel files and no
    --only, the kernels of those files alone are chosen; a mode with nothing chosen is
    left out. Bad names or files, or nothing chosen at all, exit with one line."""
    kernel_files, modes = list(kernel_files), list(modes)
    from_files: list[KernelSpec] = []
    chosen: dict[str, list[KernelSpec]] = {}
    try:
        backends = _runnable_backends(list(backends))
        for path in kernel_files:
            from_files += load_kernel_file(path)
        known = {(k.name, k.mode) for k in list_kernels()}
        for name in only:
            if not any((name, m) in known for m in modes):
                select_kernels(only=[name], mode=modes[0])  # raises the "unknown kernel" error
        for mode in modes:
            names = only or [k.name for k in from_files if k.mode == mode]
            names = [n for n in names if (n, mode) in known]
            if (only or kernel_files) and not names:
                continue
            picked = select_kernels(functions, backends, names, mode)
            if picked:
                chosen[mode] = picked
    except (KernelFileError, ValueError) as e:
        fail(str(e))
    chosen = _runnable(chosen, only)
    if not chosen:
        if kernel_files and not only:
            fail(f"no {'/'.join(modes)} kernel registered by {', '.join(kernel_files)}")
        fail("no kernel matches the given --function/--backend/--only filters")
    return chosen


def _note(message: str) -> None:
    click.echo(f"elasticbench: note: {message}", err=True)


def _runnable_backends(backends: list[str]) -> list[str]:
    """The named backends that can run here; the others are left out with a note, or are
    an error when none of the named ones can run."""
    why = {b: get_backend(b).unavailable() for b in backends}
    runnable = [b for b in backends if not why[b]]
    for b in backends:
        if why[b] and not runnable:
            fail(f"backend {b} cannot run here: {why[b]}")
        if why[b]:
            _note(f"left out backend {b}: {why[b]}")
    return runnable


def _runnable(chosen: dict[str, list[KernelSpec]], only: list[str]
              ) -> dict[str, list[KernelSpec]]:
    """The chosen kernels whose backend can run here. A kernel named with --only that cannot
    is an error; others (a kernel file's, say) are left out with a note on stderr."""
    kept: dict[str, list[KernelSpec]] = {}
    dropped: dict[str, list[str]] = {}
    for mode, specs in chosen.items():
        for spec in specs:
            why = get_backend(spec.backend).unavailable()
            if why and spec.name in only:
                fail(f"kernel {spec.name} ({spec.backend}) cannot run here: {why}")
            if why:
                dropped.setdefault(spec.backend, []).append(spec.name)
            else:
                kept.setdefault(mode, []).append(spec)
    for backend, names in dropped.items():
        why = get_backend(backend).unavailable()
        if not kept:
            fail(f"{', '.join(sorted(set(names)))} ({backend}) cannot run here: {why}")
        _note(f"left out {', '.join(sorted(set(names)))} ({backend}): {why}")
    return kept


def choose_kernels(
    functions: list[str],
    backends: list[str],
    only: list[str],
    kernel_files: Iterable[str],
    mode: str = "fwd",
) -> list[KernelSpec]:
    """choose_kernels_by_mode for a single mode."""
    return choose_kernels_by_mode(functions, backends, only, kernel_files, (mode,))[mode]


def quiet() -> bool:
    """Whether the global --quiet was given: commands then print their summary line alone."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and (ctx.find_root().obj or {}).get("quiet"))


def console(stderr: bool = False) -> Console:
    """A rich console: plain text when not a terminal, no colour under NO_COLOR; under
    --quiet, tables rendered to standard output print nothing (see report.terminal)."""
    return Terminal(stderr=stderr, highlight=False, summary_only=quiet() and not stderr)


def kernel_options(verb: str) -> Callable[[Callable], Callable]:
    """The kernel-selection options every timing or checking command takes."""
    options = [
        click.option("-f", "--function", "functions", multiple=True, metavar="F",
                     help="Only kernels of this function (repeat or comma-separate)."),
        click.option("-b", "--backend", "backends", multiple=True, metavar="B",
                     help=f"Only kernels of this backend: {', '.join(BACKEND_NAMES)}."),
        click.option("-d", "--dtype", "dtypes", multiple=True, metavar="D",
                     help=f"Only these dtypes: {', '.join(DTYPE_NAMES)}."),
        click.option("--only", "only", multiple=True, metavar="NAME,...",
                     help="Only these kernels (baselines too, by name)."),
        click.option("--kernel-file", "kernel_files", multiple=True,
                     type=click.Path(dir_okay=False), metavar="PATH",
                     help=f"Load kernels from a Python file; without --only, {verb} just those."),
    ]
    return _compose(options)


def survival_options(unit: str) -> Callable[[Callable], Callable]:
    """Isolation, time limits, resuming and sharding, the same for run and verify."""
    options = [
        click.option("--isolate", is_flag=True,
                     help=f"Call kernels in a worker process: a crash or OOM kill fails its "
                          f"{unit}."),
        click.option("--timeout", type=float, default=None, metavar="SECONDS",
                     help=f"Fail a {unit} that runs longer than this (implies --isolate)."),
        click.option("--resume", "resume_path", type=click.Path(dir_okay=False),
                     metavar="PATH",
                     help=f"Continue an interrupted results file, skipping each {unit} it has."),
        click.option("--shard", "shard", metavar="K/N",
                     help="Only shard K of N of the matrix (deterministic; see merge)."),
    ]
    return _compose(options)


def check_survival(timeout: float | None, resume_path: str | None, json_path: str | None,
                   shard: str | None) -> tuple[int, int] | None:
    """Validate the survival options together (one-line exit 2); return the parsed shard."""
    if timeout is not None and not timeout > 0:
        fail(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if resume_path and json_path:
        fail("--resume continues writing its own file; leave out --json")
    try:
        return parse_shard(shard) if shard else None
    except ValueError as e:
        fail(str(e))


def note_options(fn: Callable) -> Callable:
    """--failures and --traceback: how much of each failure verify and report show."""
    options = [
        click.option("--failures", "failures", default="all", show_default=True,
                     metavar="N|all",
                     help="Show at most N failing cases (groups of dtypes) per kernel."),
        click.option("--traceback", "traceback", is_flag=True,
                     help="Print the whole traceback of each exception a kernel raised."),
    ]
    return _compose(options)(fn)


def failures_shown(failures: str, traceback: bool) -> NoteOptions:
    """The note options from --failures and --traceback (one line and exit 2 if bad)."""
    text = str(failures).strip().lower()
    if text == "all":
        return NoteOptions(None, traceback)
    if not text.isdigit():
        fail(f"--failures takes a number or 'all', got {failures!r}")
    return NoteOptions(int(text), traceback)


def run_or_fail(session: Session, job: Job, path: Path | None,
                shard: tuple[int, int] | None = None) -> bool:
    """session.run(job, shard); a reference that cannot be computed (a dead reference
    process) is one line and exit 2, the results file closed with what finished."""
    try:
        return session.run(job, shard)
    except TruthError as e:
        fail(f"{e}" + (f"; the finished records are in {path}" if path else ""))


def run_session(job: Job, path: Path | None, meta: dict[str, Any], *,
                shard: tuple[int, int] | None, resume: bool,
                notes: NoteOptions = EVERY_FAILURE) -> NoReturn:
    """Run a job in a session writing path, print its tables and summary line, and exit:
    0 when nothing failed, 1 when a record failed, 2 when the session cannot start, 130 when
    interrupted (the finished records are kept; the line says how to --resume)."""
    try:
        session = Session(job.kind, path, meta, resume=resume, console=console(stderr=True))
    except SessionError as e:
        fail(str(e))
    complete = run_or_fail(session, job, path, shard)
    summary = section(ResultsFile(str(path or ""), job.kind, session.header, session.records),
                      notes)
    print_tables(summary.sheets, summary.notes, console())
    if "reference" in session.header:
        click.echo(TruthStats.from_dict(session.header["reference"]).summary())
    line = f"{summary.summary} ({session.elapsed_s:.1f}s)"
    line += f"; records in {path}" if path else ""
    # plain echo: a summary line is never folded, whatever the terminal's width
    if not complete:
        click.echo(f"interrupted: {line}", err=True)
        if path:
            click.echo(f"continue with the same options and --resume {path}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo(line)
    sys.exit(EXIT_FAILED if summary.failed else EXIT_OK)


def _compose(options: list[Callable[[Callable], Callable]]) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return deco
