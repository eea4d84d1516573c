"""Run tables: per function, kernel x size -> median, GB/s, % of copy bandwidth, % of roof,
speedup over the baseline, verdict. Works on records alone (a saved file renders the same)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table


def _time(s: float) -> str:
    if s >= 1:
        return f"{s:.2f}s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f}ms"
    return f"{s * 1e6:.1f}µs"


def _size(r: dict[str, Any], dtypes: int) -> str:
    rows, n = r["shape"]
    text = f"{rows}x{n}" + (f" {r['dtype']}" if dtypes > 1 else "")
    return text + ("*" if r.get("cache") == "in-cache" else "")


def _verdict(r: dict[str, Any]) -> str:
    v = r.get("verify", {})
    status = v.get("status", "unverified")
    if "error" in r:
        return "[bold red]ERROR[/]"
    if r.get("baseline"):
        return "base" if status == "pass" else "[yellow]base*[/]"
    return {"pass": "[green]pass[/]", "FAIL": "[bold red]FAIL[/]"}.get(status, f"[dim]{status}[/]")


def render_run(records: list[dict[str, Any]], ceilings: dict[str, Any] | None,
               console: Console) -> None:
    """Print one table per function, then the ceilings."""
    functions: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        functions.setdefault(r["function"], []).append(r)
    for function, recs in functions.items():
        ndt = len({r["dtype"] for r in recs})
        table = Table(title=f"{function} ({recs[0].get('mode', 'fwd')})", title_justify="left",
                      caption="size* in cache; GB/s: minimum traffic; roof e/m: exp/memory "
                              "binds; base*: baseline failed verification", caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                      collapse_padding=True)
        table.add_column("kernel", no_wrap=True, style="bold")
        table.add_column("size", overflow="fold")
        table.add_column("median", justify="right", no_wrap=True)
        table.add_column("GB/s", justify="right", no_wrap=True)
        table.add_column("%copy", justify="right", no_wrap=True)
        table.add_column("%roof", justify="right", no_wrap=True)
        table.add_column("x base", justify="right", no_wrap=True)
        table.add_column("verify", no_wrap=True)
        for r in recs:
            if "error" in r:
                table.add_row(r["kernel"], _size(r, ndt), "-", "-", "-", "-", "-", _verdict(r))
                continue
            sp = r.get("speedup")
            table.add_row(
                r["kernel"], _size(r, ndt), _time(r["median_s"]), f"{r['gbps']:.2f}",
                f"{r['pct_copy']:.0f}%", f"{r['pct_roof']:.0f}% {r['binding'][0]}",
                f"{sp:.2f}" if sp else "-", _verdict(r),
            )
        console.print(table)
    if ceilings:
        exp = ", ".join(f"{d} {v:.2f}" for d, v in ceilings["exp_geps"].items())
        console.print(f"ceilings: copy {ceilings['copy_gbps']:.1f} GB/s; exp G elements/s: {exp}")
    for r in records:
        if "error" in r:
            console.print(f"[bold red]ERROR[/] {r['kernel']} {r['shape']}: {r['error']}")
        elif r.get("verify", {}).get("status") == "FAIL" and not r.get("baseline"):
            console.print(f"[bold red]FAIL[/] {r['kernel']} {r['dtype']} (not ranked): "
                          f"{r['verify'].get('reason')}")
        warning = r.get("timing", {}).get("warning") if "timing" in r else None
        if warning:
            console.print(f"[yellow]noisy[/] {r['kernel']} {r['shape']}: {warning}")
