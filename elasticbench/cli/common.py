"""Pieces every subcommand shares: one-line errors, name lists, kernel files."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import NoReturn

import click
from rich.console import Console

from ..registry import (
    KernelFileError,
    KernelSpec,
    list_kernels,
    load_kernel_file,
    select_kernels,
)
from ..report.terminal import Terminal

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def fail(message: str) -> NoReturn:
    """Print one line naming the problem and exit with the usage code."""
    first = " ".join(str(message).split())
    click.echo(f"elasticbench: error: {first}", err=True)
    sys.exit(EXIT_USAGE)


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
    if not chosen:
        if kernel_files and not only:
            fail(f"no {'/'.join(modes)} kernel registered by {', '.join(kernel_files)}")
        fail("no kernel matches the given --function/--backend/--only filters")
    return chosen


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
