"""The static audit of the registered Triton kernels, and a model of them on a GPU's datasheet.

The kernels are called on CPU tensors with their launches captured; each launch is compiled for
the target architecture (`compile`) and read back: registers, spills, shared memory, resident
programs per SM, global load/store widths, the exponential and division instructions in the
PTX, and SASS instructions per element. From those and a GPU's datasheet figures it estimates
which of issue slots, the special-function unit or DRAM bounds the kernel. The estimate is a
model, not a measurement: only `elasticbench run` on a GPU measures.

    python -m elasticbench.harness.audit --gpu h100-sxm --json audit.json
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import torch

from elasticbench import launches
from elasticbench.harness.audit.capture import Launch, capture_launches
from elasticbench.harness.audit.compile import compile_launch, opcode_width, read_cubin
from elasticbench.harness.functions import get_function
from elasticbench.harness.registry import KernelSpec, list_kernels
from elasticbench.kernels.triton.launch import DTYPES, SMLimits, resident_programs


@dataclass(frozen=True)
class GPUModel:
    """Datasheet figures of a GPU (not measurements) and its SM limits."""

    name: str
    arch: int
    sms: int
    clock_ghz: float  # boost clock
    bandwidth_gbs: float  # DRAM, datasheet
    sm: SMLimits


GPUS: dict[str, GPUModel] = {
    "h100-sxm": GPUModel("H100 SXM5 80GB", 90, 132, 1.98, 3350.0, SMLimits()),
    "h200": GPUModel("H200 SXM 141GB", 90, 132, 1.98, 4800.0, SMLimits()),
    "a100-sxm": GPUModel("A100 SXM4 80GB", 80, 108, 1.41, 2039.0, SMLimits(shared=167936)),
}

# Per SM and clock: 4 schedulers issue one warp instruction each (128 thread instructions);
# the special-function unit (MUFU: ex2, rcp) completes 16 (sm_80, sm_90).
ISSUE_PER_CLOCK = 128
MUFU_PER_CLOCK = 16


TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Audit:
    """What the compiler made of one kernel launch, and the model's bounds in G elements/s."""

    kernel: str
    mode: str
    dtype: str
    n: int
    path: str  # the launch plan's path: fused, rows, online, split or resident
    block: int
    num_warps: int
    regs: int
    local_bytes: int  # stack and local memory per thread
    local_stores: int  # STL instructions: register spills
    shared: int
    programs_per_sm: int
    ldg_bits: list[int]
    stg_bits: list[int]
    ptx_ex2_approx: int
    ptx_ex2_ftz: bool  # every ex2 flushes subnormal results (ex2.approx.ftz.f32)
    ptx_div_rn: int  # IEEE divisions, flushing or not (div.rn[.ftz].f32)
    ptx_div_ftz: bool  # some IEEE division flushes subnormal results (Triton 3.4 lowers
    # tl.math.div_rn to div.rn.ftz.f32; later ones to div.rn.f32)
    sass_instructions: int
    sass_per_element: float
    mufu_per_element: float
    bytes_per_element: int
    issue_bound: float
    mufu_bound: float
    memory_bound: float
    limiter: str


def _default_params(spec: KernelSpec) -> dict[str, float]:
    return {p.name: p.default for p in get_function(spec.function).params}


def _capture(spec: KernelSpec, dtype: str, rows: int, n: int) -> tuple[list[Launch], str]:
    """spec's launches for a (rows, n) call, and the path its launch plan took."""
    x = torch.empty(rows, n, dtype=TORCH_DTYPES[dtype])
    with launches.noting() as notes, capture_launches() as captured:
        if spec.mode == "bwd":
            spec.fn(x, torch.empty_like(x), torch.empty_like(x), **_default_params(spec))
        else:
            spec.fn(x, **_default_params(spec))
    # the plan's note, as kernels/triton/launch.py writes it: "[backward ]<path> <geometry>"
    path = notes[-1].removeprefix("backward ").split()[0] if notes else "?"
    return captured, path


def audit_kernel(spec: KernelSpec, dtype: str, n: int, gpu: GPUModel,
                 rows: int = 1024) -> Audit:
    """Compile spec's row kernel for (rows, n) in dtype and model it on gpu."""
    captured, path = _capture(spec, dtype, rows, n)
    launch = captured[0]  # the row kernel (the split path's first pass); more may follow
    compiled = compile_launch(launch, gpu.arch)
    regs, local_bytes, ops = read_cubin(compiled.asm["cubin"])
    ex2 = re.findall(r"\bex2\.approx[.a-z0-9]*", compiled.asm["ptx"])
    divs = re.findall(r"\bdiv\.rn(?:\.ftz)?\.f32", compiled.asm["ptx"])
    block = int(launch.kwargs["BLOCK"])
    per_thread = block / (32 * launch.num_warps)  # elements a thread holds per row or chunk
    counts = Counter(op.split(".")[0] for op in ops)
    itemsize = TORCH_DTYPES[dtype].itemsize
    arrays = 4 if spec.mode == "bwd" else 2  # x (y, g) read and the result written
    # the online and split paths read a row again after its statistics; the others hold it
    rereads = (3 if spec.mode == "bwd" else 1) if path in ("online", "split") else 0
    bytes_per_element = (arrays + rereads) * itemsize
    sass_pe = len(ops) / per_thread
    mufu_pe = counts["MUFU"] / per_thread
    clock = gpu.sms * gpu.clock_ghz
    bounds = {
        "issue": clock * ISSUE_PER_CLOCK / sass_pe,
        "mufu": clock * MUFU_PER_CLOCK / mufu_pe if mufu_pe else float("inf"),
        "memory": gpu.bandwidth_gbs / bytes_per_element,
    }
    return Audit(
        kernel=spec.name, mode=spec.mode, dtype=dtype, n=n, path=path,
        block=block, num_warps=launch.num_warps, regs=regs, local_bytes=local_bytes,
        local_stores=counts["STL"],
        shared=int(compiled.metadata.shared),
        programs_per_sm=resident_programs(regs, compiled.metadata.shared, launch.num_warps,
                                             gpu.sm),
        ldg_bits=sorted({opcode_width(op) for op in ops if op.startswith("LDG")}),
        stg_bits=sorted({opcode_width(op) for op in ops if op.startswith("STG")}),
        ptx_ex2_approx=len(ex2),
        ptx_ex2_ftz=bool(ex2) and all(".ftz" in op for op in ex2),
        ptx_div_rn=len(divs), ptx_div_ftz=any(".ftz" in op for op in divs),
        sass_instructions=len(ops), sass_per_element=round(sass_pe, 2),
        mufu_per_element=round(mufu_pe, 3), bytes_per_element=bytes_per_element,
        issue_bound=round(bounds["issue"], 1), mufu_bound=round(bounds["mufu"], 1),
        memory_bound=round(bounds["memory"], 1), limiter=min(bounds, key=bounds.__getitem__),
    )


def triton_specs(names: Iterable[str] = ()) -> list[KernelSpec]:
    """The built-in triton kernels (forward and backward), optionally only those named."""
    # registered here even where the backend cannot run them: compiling needs no GPU
    from elasticbench.harness.builtin import triton_kernels  # noqa: F401
    wanted = set(names)
    specs = [s for mode in ("fwd", "bwd") for s in list_kernels(mode=mode)
             if s.backend == "triton" and (not wanted or s.name in wanted)]
    if wanted - {s.name for s in specs}:
        unknown = ", ".join(sorted(wanted - {s.name for s in specs}))
        raise click.BadParameter(f"not triton kernels: {unknown}")
    return specs


def run_audit(specs: list[KernelSpec], dtypes: list[str], sizes: list[int], gpu: GPUModel,
              progress: Callable[[str], None] = lambda _: None) -> list[Audit]:
    audits = []
    for spec in specs:
        for dtype in dtypes:
            for n in sizes:
                progress(f"{spec.name} {spec.mode} {dtype} n={n}")
                audits.append(audit_kernel(spec, dtype, n, gpu))
    return audits


def _table(audits: list[Audit], gpu: GPUModel) -> Any:
    from rich.table import Table

    table = Table(title=f"Triton kernels compiled for sm_{gpu.arch}; bounds from {gpu.name} "
                        f"datasheet figures (G elements/s, a model, not a measurement)")
    for col in ("kernel", "mode", "dtype", "n", "path", "warps", "regs", "STL",
                "prog/SM", "LDG bits", "SASS/el", "MUFU/el", "issue", "mufu", "memory",
                "limiter"):
        table.add_column(col, justify="left" if col in ("kernel", "mode", "dtype", "path",
                                                         "limiter") else "right")
    for a in audits:
        table.add_row(a.kernel, a.mode, a.dtype, str(a.n), a.path, str(a.num_warps), str(a.regs),
                      str(a.local_stores), str(a.programs_per_sm),
                      ",".join(map(str, a.ldg_bits)), f"{a.sass_per_element:.1f}",
                      f"{a.mufu_per_element:.2f}", f"{a.issue_bound:.0f}",
                      f"{a.mufu_bound:.0f}", f"{a.memory_bound:.0f}", a.limiter)
    return table


@click.command()
@click.option("--gpu", "gpu_name", type=click.Choice(sorted(GPUS)), default="h100-sxm",
              show_default=True, help="Architecture to compile for and datasheet to model.")
@click.option("--kernel", "kernels", multiple=True, help="Only these triton kernels.")
@click.option("-d", "--dtype", "dtypes", default="fp32,fp16,bf16", show_default=True)
@click.option("--sizes", default="1024,4096,16384,65536", show_default=True,
              help="Row lengths n (comma-separated).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the audit records here.")
def main(gpu_name: str, kernels: tuple[str, ...], dtypes: str, sizes: str,
         json_path: str | None) -> None:
    """Compile every triton kernel for a GPU and report what the compiler made of it."""
    from rich.console import Console

    console = Console(stderr=True)
    gpu = GPUS[gpu_name]
    try:
        ns = [int(s) for s in sizes.split(",") if s.strip()]
        dts = [d.strip() for d in dtypes.split(",") if d.strip()]
        bad = [d for d in dts if d not in DTYPES]
        if bad or not ns or min(ns) < 1:
            raise ValueError(f"dtypes must be among {', '.join(DTYPES)} and sizes >= 1")
    except ValueError as e:
        console.print(f"error: {e}")
        sys.exit(2)
    with console.status("compiling") as status:
        audits = run_audit(triton_specs(kernels), dts, ns, gpu,
                           lambda what: status.update(f"compiling {what}"))
    Console(width=max(160, Console().width)).print(_table(audits, gpu))
    if json_path:
        records = {"gpu": asdict(gpu), "audits": [asdict(a) for a in audits]}
        Path(json_path).write_text(json.dumps(records, indent=1) + "\n")
