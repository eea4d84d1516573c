"""The Triton attention kernel's configurations as the compiler makes them for Hopper: each
compiled for sm_90a without a GPU (elasticbench.harness.audit's captured launches), and whether its
dots are wgmma, its shared memory fits, nothing spills and its loads are TMA exactly where
the configuration says so (docs/triton.md, docs/attention.md section 7). The forward is
compiled without and with the gate (its epilogue's gate tile and ungated store: the
keep_ungated variant, a gated call's most live values)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch

from elasticbench.attention.weights import Weight
from elasticbench.harness.audit.capture import capture_launches
from elasticbench.harness.audit.compile import compile_launch, resource_usage
from elasticbench.kernels.triton import attention_configs as ac
from elasticbench.kernels.triton.attention_configs import Tiles
from elasticbench.kernels.triton.flash_attention import attention_backward, attention_forward

SHARED_PER_BLOCK = 227 * 1024  # sm_90: 228 KiB per SM, 227 KiB usable by one block


@dataclass(frozen=True)
class CompileReport:
    """What the compiler made of one configuration for sm_`arch` (no GPU needed): whether
    its dots are warpgroup MMAs (wgmma) or the older mma.sync, its shared memory, registers
    and spilled bytes per thread, and whether it moves tiles by TMA (cp.async.bulk.tensor)."""

    kernel: str
    head_dim: int
    dtype: str
    causal: bool
    tiles: Tiles
    weight: str
    wgmma: bool
    mma_sync: bool
    shared: int
    regs: int
    spills: int
    tma: bool = False
    padded: bool = False
    gate: bool = False

    def problems(self) -> list[str]:
        """What keeps this configuration off Hopper's fast path, if anything (fp32 has no
        tensor-core instruction, so only its memory and spills count)."""
        out = []
        if self.dtype != "float32" and (not self.wgmma or self.mma_sync):
            out.append("falls back to mma.sync" if self.mma_sync else "no wgmma")
        if self.shared > SHARED_PER_BLOCK:
            out.append(f"{self.shared} B of shared memory > {SHARED_PER_BLOCK}")
        if self.spills:
            out.append(f"spills {self.spills} B per thread")
        if self.tma != self.tiles.tma:
            out.append("TMA configuration without TMA" if self.tiles.tma else "TMA unasked")
        return out


def compile_report(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool, tiles: Tiles,
                   arch: int = 90, weight: Weight = Weight.ELASTIC,
                   padded: bool = False, gate: bool = False) -> CompileReport:
    """Compile `kernel`'s launch for `weight` with `tiles` for sm_`arch` through
    elasticbench.harness.audit (the wrapper is driven with CPU tensors and its launches captured,
    not run); padded: with a key-padding mask; gate: the forward with a gate, keeping the
    ungated output."""
    q = torch.zeros(1, 2, 1024, head_dim, dtype=dtype)
    heads = torch.ones(1, 2)
    stats = torch.zeros(1, 2, 1024)
    keep = (torch.arange(1024) < 700)[None] if padded else None
    with capture_launches() as launches:
        if kernel == "fwd":
            attention_forward(q, q, q, heads, heads, 0.125, causal, keep, weight=weight,
                              tile=tiles, gate=torch.zeros_like(q) if gate else None,
                              keep_ungated=gate)
        else:
            attention_backward(q, q, q, q, q, stats, stats + 1, heads, heads, 0.125, causal,
                               keep, weight=weight, tiles=(tiles, tiles))
    name = {"fwd": "attention_forward_kernel", "dkdv": "attention_dkdv_kernel",
            "dq": "attention_dq_kernel"}[kernel]
    compiled = compile_launch(next(la for la in launches if la.name == name), arch)
    ptx = compiled.asm["ptx"]
    regs, spills = resource_usage(compiled.asm["cubin"])
    return CompileReport(kernel, head_dim, str(dtype).removeprefix("torch."), causal, tiles,
                         Weight(weight).name.lower(), "wgmma.mma_async" in ptx, "mma.sync" in ptx,
                         int(compiled.metadata.shared), regs, spills,
                         "cp.async.bulk.tensor" in ptx, padded, gate and kernel == "fwd")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class AuditItem:
    """One configuration a call can launch: the key it is offered for and its tiles."""

    kernel: str
    head_dim: int
    dtype: str
    causal: bool
    padded: bool
    weight: str
    tiles: Tiles
    gate: bool = False


def launchable(dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32"),
               weights: tuple[str, ...] | None = None,
               head_dims: tuple[int, ...] = (64, 128)) -> Iterator[AuditItem]:
    """Every configuration the table and the rule can launch at these head-dim classes: for
    each (kernel, dtype, causal, key padding, weight, and for the forward without and with a
    gate) the pointer configurations and the TMA ones (where this Triton has descriptors),
    as `attention_configs.configs` lists them
    (a table may name only those: attention_configs.load_table refuses others). The rule's
    configurations (the first of each pointer list: what a call launches where no table
    names its key) come first, then the rest, so that an audit stopped early has covered
    what runs by default."""
    items = list(_every(dtypes, weights, head_dims))
    ruled = [_is_rule(i) for i in items]
    yield from (i for i, r in zip(items, ruled, strict=True) if r)
    yield from (i for i, r in zip(items, ruled, strict=True) if not r)


def _every(dtypes: tuple[str, ...], weights: tuple[str, ...] | None,
           head_dims: tuple[int, ...]) -> Iterator[AuditItem]:
    names = weights or tuple(w.name.lower() for w in Weight)
    for weight in names:
        w = Weight[weight.upper()]
        for dtype in dtypes:
            for kernel in ac.KERNELS:
                for head_dim in head_dims:
                    for causal in (False, True):
                        for padded in (False, True):
                            for tma in (False, True):
                                for t in ac.configs(kernel, head_dim, DTYPES[dtype], causal,
                                                    w, tma, padded):
                                    for gate in GATES[kernel]:
                                        yield AuditItem(kernel, head_dim, dtype, causal,
                                                        padded, w.name.lower(), t, gate)


GATES = {"fwd": (False, True), "dkdv": (False,), "dq": (False,)}  # the backward has no gate


def _is_rule(item: AuditItem) -> bool:
    """Whether `item` is the rule's configuration for its key (attention_configs.rule)."""
    if item.tiles.tma:
        return False
    plain = ac.configs(item.kernel, item.head_dim, DTYPES[item.dtype], item.causal,
                       Weight[item.weight.upper()], padded=item.padded)
    return bool(plain) and ac.rule(plain) == item.tiles


def audit(items: list[AuditItem], arch: int = 90,
          progress: Callable[[AuditItem, CompileReport], None] | None = None
          ) -> list[CompileReport]:
    """Compile each item for sm_`arch` (`compile_report`); progress(item, report) after each."""
    reports = []
    for item in items:
        report = compile_report(item.kernel, item.head_dim, DTYPES[item.dtype], item.causal,
                                item.tiles, arch, Weight[item.weight.upper()], item.padded,
                                item.gate)
        reports.append(report)
        if progress is not None:
            progress(item, report)
    return reports


def report_record(report: CompileReport) -> dict:
    """A report as a JSON object (tiles as their text, `problems` listed)."""
    out = asdict(report)
    out["tiles"] = str(report.tiles)
    out["problems"] = report.problems()
    return out
