"""`elasticbench selftest`: the verifier must catch every built-in mutant and pass every
correct kernel."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from elasticbench.harness.backends import get_backend
from elasticbench.harness.cli.common import EXIT_FAILED, EXIT_OK, console, fail, quiet, split_names
from elasticbench.harness.kinds import KINDS
from elasticbench.harness.numerics.truth.cache import default_cache_dir
from elasticbench.harness.registry import list_kernels
from elasticbench.harness.selftest.mutants import MUTANTS
from elasticbench.harness.selftest.outcomes import LOOSEST, caught_by_text


@click.command()
@click.option("-b", "--backend", "backends", multiple=True, metavar="B",
              help="Check only the correct kernels of these backends (the mutants always run).")
@click.option("--no-cache", is_flag=True, help="Recompute references instead of reading the cache.")
def selftest(backends: tuple[str, ...], no_cache: bool) -> None:
    """Run deliberately wrong kernels through verify; exit 1 unless all are caught (the row
    mutants also under the `own` contract at budget scale 4) and every built-in kernel
    passes (the quick matrices, rows and attention)."""
    out = console()
    chosen = split_names(backends)
    for name in chosen:
        try:
            get_backend(name)
        except ValueError as e:
            fail(str(e))
    outcomes = []
    for kind in KINDS.values():
        correct = [k for k in list_kernels() if k.source == "builtin" and not k.baseline
                   and k.kind == kind.name and (not chosen or k.backend in chosen)]
        outcomes += kind.selftest(correct, None if no_cache else default_cache_dir())
    table = Table(title="mutation self-test", title_justify="left")
    table.add_column("mutant / kernel", no_wrap=True, style="bold")
    table.add_column("verdict", no_wrap=True)
    table.add_column("first failing case")
    for o in outcomes:
        if o.expected_to_fail:
            verdict = "[green]caught[/]" if o.ok else "[bold red]MISSED[/]"
        else:
            verdict = "[green]passes[/]" if o.ok else "[bold red]FAILS[/]"
        table.add_row(o.name, verdict, caught_by_text(o) if o.caught_by else "")
    out.print(table)
    for o in outcomes:
        if o.expected_to_fail and not o.loosest and not quiet():
            click.echo(f"  {o.name}: {o.bug}")
    mutants = [o for o in outcomes if o.expected_to_fail and not o.loosest]
    loose = [o for o in outcomes if o.loosest]
    good = [o for o in outcomes if not o.expected_to_fail]
    allowed = [m.spec.name for m in MUTANTS if m.own_allows]
    click.echo(f"mutation score {sum(o.ok for o in mutants)}/{len(mutants)}; under the own "
               f"contract at budget scale {LOOSEST.scale:g}: {sum(o.ok for o in loose)}/"
               f"{len(loose)} (it allows {', '.join(allowed)}); correct kernels passing "
               f"{sum(o.ok for o in good)}/{len(good)}")
    sys.exit(EXIT_OK if all(o.ok for o in outcomes) else EXIT_FAILED)
