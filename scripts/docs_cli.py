"""Write docs/guide/cli.md, the command-line reference, from the commands' own help.

    .venv/bin/python scripts/docs_cli.py           # rewrite docs/guide/cli.md
    .venv/bin/python scripts/docs_cli.py --check   # exit 1 if the file is not current

Every command and subcommand of `elasticbench` gets a section holding its `--help` text as
click renders it at a fixed width of 100 columns, so the page reads the same on every
machine. tests/project/test_docs.py fails when the page differs from what this script writes: after
changing an option, run the script and commit the page with the change.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "guide" / "cli.md"
WIDTH = 100

HEAD = """# Command-line reference

Generated from each command's `--help` by `scripts/docs_cli.py`; do not edit by hand (run
`.venv/bin/python scripts/docs_cli.py` after changing an option; `tests/project/test_docs.py` checks
that this page is current). What the commands are for and worked examples: the
[README](../../README.md); exit codes: [troubleshooting](troubleshooting.md#exit-codes);
environment variables: [environment.md](environment.md).

Every command exits 0 on success, 1 when what it checked failed (a case, a gate, a hunt that
found a failing input), 2 for bad usage or bad input (one line on stderr, no traceback,
before any work) and 130 when interrupted (the finished records are kept).
"""


def _walk(command: click.Command, path: list[str]) -> list[tuple[list[str], click.Command]]:
    """The command and, for a group, each subcommand under it, sorted by name."""
    found = [(path, command)]
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            found += _walk(command.commands[name], [*path, name])
    return found


def _help(root: click.Group, path: list[str]) -> str:
    """The --help text of the command at `path` under the root group, at WIDTH columns, as
    `elasticbench <path> --help` prints it (its usage line names the whole path)."""
    ctx = click.Context(root, info_name="elasticbench", terminal_width=WIDTH,
                        max_content_width=WIDTH, **root.context_settings)
    command: click.Command = root
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
        ctx = click.Context(command, info_name=name, parent=ctx, **command.context_settings)
    return ctx.get_help()


def render() -> str:
    """The whole page: the head, then one section per command."""
    from elasticbench.harness.cli import cli

    parts = [HEAD]
    for path, _command in _walk(cli, []):
        title = " ".join(["elasticbench", *path])
        parts.append(f"## `{title}`\n\n```\n{_help(cli, path)}\n```\n")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    """Write the page, or with --check compare it; 1 when it is not current, 2 for bad usage."""
    if argv not in ([], ["--check"]):
        print("usage: docs_cli.py [--check]", file=sys.stderr)
        return 2
    text = render()
    if argv == ["--check"]:
        current = PAGE.read_text() if PAGE.is_file() else ""
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is not current: run scripts/docs_cli.py")
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
