"""`elasticbench audit --attention`: compile every attention configuration a call can launch
for an NVIDIA GPU (sm_90a by default) without one, and fail on any that spills, falls back
to mma.sync or overflows shared memory (docs/attention.md section 7)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import click
from rich.table import Table

from elasticbench.harness.cli.common import EXIT_FAILED, EXIT_OK, console, fail, quiet, split_names


def _parse(values: tuple[str, ...], allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(split_names(values)) if values else allowed
    bad = [n for n in names if n not in allowed]
    if bad:
        fail(f"unknown {what} {bad[0]!r}: choose from {', '.join(allowed)}")
    return names


@click.command("audit")
@click.option("--attention", is_flag=True,
              help="Compile every configuration the attention kernels' table and rule can "
                   "launch (the only audit this command runs; `python -m elasticbench.harness.audit` "
                   "models the row kernels).")
@click.option("--arch", type=int, default=90, show_default=True,
              help="The CUDA compute capability to compile for (90: sm_90a, Hopper).")
@click.option("-d", "--dtypes", multiple=True, metavar="LIST",
              help="Comma-separated of bf16, fp16, fp32 (default all).")
@click.option("--weights", multiple=True, metavar="LIST",
              help="Comma-separated of elastic, softmax1, symax, stablemax, sigmoid, cog "
                   "(default all).")
@click.option("--head-dims", default="64,128", show_default=True, metavar="LIST",
              help="Head-dim classes to compile.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every compile report (and the Triton version) to this JSON file.")
def audit(attention: bool, arch: int, dtypes: tuple[str, ...], weights: tuple[str, ...],
          head_dims: str, json_path: str | None) -> None:
    """Compile the attention configurations for sm_ARCH on this machine (no GPU needed) and
    exit 1 naming any that spills registers, whose 16-bit dots fall back to mma.sync, that
    needs more than 227 KiB of shared memory, or whose TMA form has no TMA; exit 0 with a
    summary table otherwise. Compiles are cached by Triton (~/.triton/cache): a second run
    is quick."""
    from elasticbench.attention.weights import Weight
    from elasticbench.devices import triton_interpreted

    if not attention:
        fail("say what to audit: `elasticbench audit --attention` (the row kernels: "
             "`python -m elasticbench.harness.audit`)")
    if triton_interpreted():
        fail("the compile audit needs Triton's compiler: unset TRITON_INTERPRET")
    if arch < 80:
        fail(f"--arch {arch}: the attention kernels are written for sm_80 and later")
    try:
        dims = tuple(int(x) for x in split_names([head_dims]))
    except ValueError:
        fail(f"--head-dims must be comma-separated integers, got {head_dims!r}")
    if not dims or any(d not in (64, 128) for d in dims):
        fail(f"--head-dims: the audited classes are 64 and 128, got {head_dims!r}")
    names = _parse(dtypes, ("bf16", "fp16", "fp32"), "dtype")
    wnames = _parse(weights, tuple(w.name.lower() for w in Weight), "weight")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # as the JIT compiles by default

    import triton

    from elasticbench.harness.audit.attention_tiles import audit as run_audit
    from elasticbench.harness.audit.attention_tiles import launchable, report_record

    items = list(launchable(names, wnames, dims))
    out = console()
    err = console(stderr=True)
    start = time.monotonic()
    reports: list = []
    from elasticbench.harness.environment import git_commit
    from elasticbench.kernels.triton import flash_attention as kernels

    source = Path(kernels.__file__)

    head = {"triton": triton.__version__, "arch": arch, "commit": git_commit(),
            # the kernel file when the audit began, and the kernels as imported (Triton's
            # cache keys: their sources and every function they call)
            "kernel_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
            "kernel_cache_keys": {name: str(getattr(kernels, name).cache_key) for name in (
                "attention_forward_kernel", "attention_dkdv_kernel", "attention_dq_kernel")},
            "dtypes": list(names), "weights": list(wnames), "head_dims": list(dims)}

    def write(complete: bool) -> None:
        """The JSON as far as compiled (rewritten after each: a kill leaves the done part)."""
        if not json_path:
            return
        bad = [r for r in reports if r.problems()]
        record = {**head, "complete": complete, "configurations": len(reports),
                  "of": len(items), "failing": len(bad),
                  "reports": [report_record(r) for r in reports]}
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, path)

    def progress(item, report) -> None:
        reports.append(report)
        write(False)
        if report.problems():
            err.print(f"  {_name(report)}: {', '.join(report.problems())}")
        elif not quiet() and len(reports) % 25 == 0:
            err.print(f"  {len(reports)}/{len(items)} compiled "
                      f"({time.monotonic() - start:.0f} s)")

    run_audit(items, arch, progress)
    write(True)
    bad = [r for r in reports if r.problems()]
    table = Table(title=f"attention configurations compiled for sm_{arch}a, "
                        f"Triton {triton.__version__}")
    for col in ("kernel", "head dim", "dtype", "configurations", "worst regs",
                "max shared KiB", "failing"):
        table.add_column(col, justify="left" if col in ("kernel", "dtype") else "right")
    groups: dict[tuple, list] = {}
    for r in reports:
        groups.setdefault((r.kernel, r.head_dim, r.dtype), []).append(r)
    for (kernel, hd, dt), rs in groups.items():
        table.add_row(kernel, str(hd), dt, str(len(rs)), str(max(r.regs for r in rs)),
                      f"{max(r.shared for r in rs) / 1024:.0f}",
                      str(sum(1 for r in rs if r.problems())))
    out.print(table)
    summary = (f"{len(reports)} attention configurations compiled for sm_{arch}a with Triton "
               f"{triton.__version__} in {time.monotonic() - start:.0f} s: ")
    if bad:
        click.echo(summary + f"{len(bad)} fail: " + "; ".join(
            f"{_name(r)} ({', '.join(r.problems())})" for r in bad))
        raise SystemExit(EXIT_FAILED)
    click.echo(summary + "none spills, falls back to mma.sync or overflows shared memory")
    raise SystemExit(EXIT_OK)


def _name(r) -> str:
    flags = [r.dtype, r.weight] + (["causal"] if r.causal else []) + \
        (["padded"] if r.padded else []) + (["gated"] if r.gate else [])
    return f"{r.kernel} {r.head_dim} {r.tiles} ({' '.join(flags)})"
