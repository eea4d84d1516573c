"""`elasticbench list`: what the suite knows about, one line each."""

from __future__ import annotations

from importlib import resources

import click

from elasticbench.harness.backends import BACKENDS
from elasticbench.harness.cli.common import split_names
from elasticbench.harness.functions import ATTENTION_FUNCTIONS, FUNCTIONS
from elasticbench.harness.inputs import GENERATORS
from elasticbench.harness.kinds.attention.qkv_inputs import ATTENTION_GENERATORS
from elasticbench.harness.numerics.contract import WIDE
from elasticbench.harness.registry import list_kernels

TOPICS = ("functions", "backends", "inputs", "kernels", "cases")


@click.command(name="list")
@click.argument("topic", type=click.Choice(TOPICS))
@click.option("--kernel-file", "kernel_files", multiple=True, type=click.Path(dir_okay=False),
              metavar="PATH", help="Also list the kernels of this file.")
def list_(topic: str, kernel_files: tuple[str, ...]) -> None:
    """List functions, backends, inputs (generators), kernels or built-in cases.

    Plain lines, never folded, so they can be read by grep and scripts. Functions and inputs
    list the row ones, then the attention ones (marked "attention:").
    """
    from elasticbench.harness.cli.common import choose_kernels

    if topic == "functions":
        # the row functions' lines keep their 10 columns; the attention names are longer
        width = max(len(n) for n in ATTENTION_FUNCTIONS)
        for f in [*FUNCTIONS.values(), *ATTENTION_FUNCTIONS.values()]:
            params = ", ".join(f"{p.name}={p.default:g}" for p in f.params)
            name = (f"{f.name.ljust(width)} attention:" if f.name in ATTENTION_FUNCTIONS
                    else f"{f.name:10s}")
            click.echo(f"{name} {f.summary}" + (f"  [{params}]" if params else ""))
    elif topic == "backends":
        width = max(10, *(len(b.name) for b in BACKENDS.values()))
        for b in BACKENDS.values():
            why = b.unavailable()
            state = f"  (not available here: {why})" if why else ""
            click.echo(f"{b.name.ljust(width)} {b.summary}{state}")
    elif topic == "inputs":
        # one name may be both (normal): --function says which kind of input a case takes
        width = max(16, *(len(n) for n in [*GENERATORS, *ATTENTION_GENERATORS]))
        for g in GENERATORS.values():
            click.echo(f"{g.name.ljust(width)} {g.summary}")
        for a in ATTENTION_GENERATORS.values():
            click.echo(f"{a.name.ljust(width)} attention: {a.summary}")
    elif topic == "kernels":
        if kernel_files:
            choose_kernels([], [], [], split_names(kernel_files))
        # a contract other than the default is named after the description
        rows = [(k.name, k.function, k.backend, k.mode,
                 k.description + (f"  [accuracy: {k.accuracy}]" if k.accuracy != WIDE else ""))
                for k in list_kernels()]
        # columns as wide as their longest entry (elastic_attention is past any fixed width)
        widths = [max((len(r[i]) for r in rows), default=0) for i in range(4)]
        for *cells, description in rows:
            click.echo(" ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
                       + f" {description}")
    else:
        for path in sorted(resources.files("elasticbench.cases").iterdir(), key=str):
            if path.name.endswith(".toml"):
                first = next((ln.lstrip("# ").strip() for ln in path.read_text().splitlines()
                              if ln.startswith("#")), "")
                click.echo(f"{path.name:22s} {first}")
