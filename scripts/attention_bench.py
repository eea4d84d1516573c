"""The fused native attention kernel against SDPA in the same process, forward and backward.

    .venv/bin/python scripts/attention_bench.py [--length 4096] [--heads 8] [--dim 64]
        [--repeat 5] [--composite] [--memory 16384] [--block-q 256] [--block-k 256]

Times (best of --repeat, after one warm-up call) torch's scaled_dot_product_attention and the
fused Elastic kernel (kernels/cpp/attention.cpp) on the same fp32 inputs (batch 1), causal and
not, each SDPA timing right before the kernel's so both see the same load; --composite adds the
eager composite (its score matrix is length^2 x heads x 4 bytes). --memory L runs the fused
forward at length L in a fresh process and reports its peak resident-memory growth over the
inputs (the peak resident size, VmHWM, reset before the call). The load average is printed beside every figure: the figures are for a
shared machine. `elasticbench run --case cases/attention.toml` is the benchmark with records.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from elasticbench.attention import native_attention
from elasticbench.attention.composite import elastic_attention_composite


class Timing:
    """The least wall-clock and the least process CPU time of `repeat` calls (after a
    warm-up call). On a shared machine the CPU time (every thread's, summed) is the steadier
    of the two: a thread that waits for a core adds wall time, not CPU time."""

    def __init__(self, fn: Callable[[], object], repeat: int) -> None:
        fn()
        walls, cpus = [], []
        for _ in range(repeat):
            c, t = time.process_time(), time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        self.wall, self.cpu = min(walls), min(cpus)

    def against(self, base: Timing) -> str:
        return (f"{self.wall * 1e3:.1f} ms ({self.wall / base.wall:.2f}x wall, "
                f"{self.cpu / base.cpu:.2f}x cpu)")


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def inputs(length: int, heads: int, dim: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, dim, generator=g) for _ in range(3))
    tau, beta = torch.ones(1, heads), torch.ones(1, heads)
    return q, k, v, tau, beta


def time_one(length: int, heads: int, dim: int, causal: bool, repeat: int,
             composite: bool) -> None:
    q, k, v, tau, beta = inputs(length, heads, dim)
    scale = 1 / math.sqrt(dim)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fwd_sdpa = Timing(lambda: sdpa(q, k, v, is_causal=causal), repeat)
    fwd_ours = Timing(lambda: native_attention.forward(q, k, v, tau, beta, scale, causal), repeat)
    line = (f"L={length} causal={int(causal)} forward: sdpa {fwd_sdpa.wall * 1e3:.1f} ms, "
            f"fused {fwd_ours.against(fwd_sdpa)}")
    if composite:
        t = Timing(lambda: elastic_attention_composite(q, k, v, tau=1.0, beta=1.0,
                                                       causal=causal), repeat)
        line += f", composite {t.against(fwd_sdpa)}"
    print(f"{line}  [{load()}]", flush=True)

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out_sdpa = sdpa(*leaves, is_causal=causal)
    dout = torch.randn(out_sdpa.shape, generator=torch.Generator().manual_seed(1))
    bwd_sdpa = Timing(lambda: torch.autograd.grad(out_sdpa, leaves, dout, retain_graph=True),
                      repeat)
    out, m, den = native_attention.forward(q, k, v, tau, beta, scale, causal)
    bwd_ours = Timing(lambda: native_attention.backward(q, k, v, out, dout, m, den, tau, beta,
                                                        scale, causal), repeat)
    print(f"L={length} causal={int(causal)} backward: sdpa {bwd_sdpa.wall * 1e3:.1f} ms, "
          f"fused {bwd_ours.against(bwd_sdpa)}  [{load()}]", flush=True)


def reset_peak_rss() -> None:
    """Linux: set the peak resident size (VmHWM) to the current one (proc(5), clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak since the last reset) in MiB, from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


def memory_child(length: int, heads: int, dim: int, causal: bool) -> None:
    q, k, v, tau, beta = inputs(length, heads, dim)
    native_attention.forward(*inputs(8, heads, dim), 0.125, causal)  # build/load, allocator warm-up
    reset_peak_rss()
    before = rss_mib("VmRSS")
    t = time.perf_counter()
    out = native_attention.forward(q, k, v, tau, beta, 1 / math.sqrt(dim), causal)[0]
    t = time.perf_counter() - t
    growth = rss_mib("VmHWM") - before
    out_mib = out.numel() * out.element_size() / 2**20
    print(f"L={length} causal={int(causal)} forward {t:.2f} s: peak RSS growth {growth:.0f} MiB "
          f"(the output alone is {out_mib:.0f} MiB; the composite's scores would be "
          f"{heads * length * length * 4 / 2**30:.1f} GiB)  [{load()}]", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, nargs="+", default=[4096])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--composite", action="store_true")
    p.add_argument("--memory", type=int, default=0, help="also the peak memory at this length")
    p.add_argument("--block-q", type=int, default=native_attention.BLOCK_Q)
    p.add_argument("--block-k", type=int, default=native_attention.BLOCK_K)
    p.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--causal", type=int, choices=(0, 1), default=None,
                   help="only this mask (default: both)")
    a = p.parse_args()
    native_attention.BLOCK_Q, native_attention.BLOCK_K = a.block_q, a.block_k
    masks = (False, True) if a.causal is None else (bool(a.causal),)
    if a.memory_child:
        memory_child(a.memory_child, a.heads, a.dim, masks[0])
        return 0
    print(f"fp32, batch 1, heads {a.heads}, head_dim {a.dim}, {torch.get_num_threads()} threads, "
          f"tiles {a.block_q} x {a.block_k}", flush=True)
    for length in a.length:
        for causal in masks:
            time_one(length, a.heads, a.dim, causal, a.repeat, a.composite)
    if a.memory:
        for causal in masks:  # a fresh process each
            subprocess.run([sys.executable, __file__, "--memory-child", str(a.memory),
                            "--heads", str(a.heads), "--dim", str(a.dim), "--causal",
                            str(int(causal)), "--block-q", str(a.block_q), "--block-k",
                            str(a.block_k)], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
