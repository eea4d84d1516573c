"""The `elasticbench` command. Each subcommand lives in its own module of this package.

Errors of usage or input are one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

import click

from elasticbench.harness.allocator import keep_freed_memory
from elasticbench.harness.cli.common import fail
from elasticbench.harness.threads import passive_openmp
from elasticbench.settings import refresh

# before the commands' modules load torch (and with it OpenMP, which reads this once)
passive_openmp(sys.argv)


def _print_versions(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """--version: the versions a results file records (numpy, torch, Triton, ...), then exit."""
    if not value or ctx.resilient_parsing:
        return
    from elasticbench.harness.environment import version_text

    click.echo(version_text())
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_versions,
              help="Show the versions a results file records (elasticbench, numpy, torch, "
                   "Triton, ...) and exit.")
@click.option("-q", "--quiet", is_flag=True,
              help="Print only each command's final summary line (and errors).")
@click.pass_context
def cli(ctx: click.Context, quiet: bool) -> None:
    """Verify softmax-family kernels against exact references, and time them against the
    machine's rooflines."""
    ctx.ensure_object(dict)["quiet"] = quiet


def _register_commands() -> None:
    from elasticbench.harness.cli.ab_cmd import ab
    from elasticbench.harness.cli.audit_cmd import audit
    from elasticbench.harness.cli.baseline_cmd import baseline
    from elasticbench.harness.cli.compare_cmd import compare_
    from elasticbench.harness.cli.gate_cmd import gate
    from elasticbench.harness.cli.hunt_cmd import hunt
    from elasticbench.harness.cli.list_cmd import list_
    from elasticbench.harness.cli.merge_cmd import merge
    from elasticbench.harness.cli.report_cmd import report
    from elasticbench.harness.cli.run_cmd import run
    from elasticbench.harness.cli.selftest_cmd import selftest
    from elasticbench.harness.cli.tune_cmd import tune
    from elasticbench.harness.cli.verify_cmd import verify

    cli.add_command(verify)
    cli.add_command(run)
    cli.add_command(hunt)
    cli.add_command(list_)
    cli.add_command(selftest)
    for command in (compare_, gate, ab, baseline, merge):
        cli.add_command(command)
    cli.add_command(report)
    cli.add_command(audit)
    cli.add_command(tune)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the group, turning usage errors into one line and exit code 2."""
    try:
        refresh()  # the command's settings, read here; a bad value is one line, before any work
    except ValueError as e:
        fail(str(e))
    keep_freed_memory()  # the reference's temporaries reuse memory instead of faulting it in
    try:
        code = cli.main(args=argv, prog_name="elasticbench", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("elasticbench: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        fail(e.format_message())
    except KeyboardInterrupt:
        click.echo("elasticbench: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def entry() -> None:
    """The console script (and `python -m elasticbench`): main(), then an exit that skips
    the interpreter's teardown of torch and inductor's modules, about a second of every
    command's wall time (README.md, Architecture). In-process callers use main()."""
    try:
        main()
        code: object = 0
    except SystemExit as e:
        code = e.code
    leave(code)


def leave(code: object) -> None:
    """Exit with `code` as sys.exit would: the atexit handlers run and the standard streams
    are flushed, then the process ends without tearing its modules down. Anything unusual
    (a text exit code, a non-daemon thread still running, no atexit hook to call) exits the
    ordinary way."""
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not (code is None or isinstance(code, int)) or others or run_exitfuncs is None:
        sys.exit(code)
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # closed, or a reader that went away (a pipe to head)
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code or 0)
