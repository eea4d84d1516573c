"""The native fused attention for every weight (elastic, softmax1, symax, stablemax, sigmoid)
against SDPA on the CPU, forward and forward+backward, in one process.

    .venv/bin/python scripts/attention_family_cpu.py [--batch 2] [--heads 4] [--length 4096]
        [--dim 64] [--threads 1] [--repeat 5] [--causal] [--weights elastic,symax,...]

Issue 50's target: fp32, B=2, H=4, L=4096, D=64, one thread, every fused forward within 1.3x
of SDPA and forward+backward within 1.5x. Each figure is the median of --repeat calls after a
warm-up, SDPA's and the kernel's calls interleaved (one of each in turn) so both see the same
load on a shared machine (the load average is printed). The kernels are called through
elasticbench.attention.cpp (the weights.py contract), SDPA through torch's autograd, so the
forward+backward figure of each is what a training step pays. --memory adds, per weight,
the peak resident memory a forward+backward adds over its inputs, outputs and gradients,
measured in a fresh child process, and SDPA's beside it (docs/native.md section 5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from elasticbench.attention import cpp
from elasticbench.attention.weights import Weight


def median_times(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """The median wall-clock seconds of `repeat` calls of each fn after one warm-up call of
    each, the calls interleaved (fns[0], fns[1], ..., fns[0], ...)."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeat):
        for fn, t in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            t.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def inputs(a: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    """q, k, v, dO and the per-(batch, head) parameters p0, p1 (fp32)."""
    g = torch.Generator().manual_seed(0)
    shape = (a.batch, a.heads, a.length, a.dim)
    q, k, v, do = (torch.randn(shape, generator=g) for _ in range(4))
    p0 = torch.full((a.batch, a.heads), 1.0)
    p1 = torch.full((a.batch, a.heads), 1.0)
    return q, k, v, do, p0, p1


def fused(weight: Weight, a: argparse.Namespace, backward: bool) -> Callable[[], object]:
    """One call of the native kernel for `weight`: the forward, or forward then backward."""
    q, k, v, do, p0, p1 = inputs(a)
    if weight is Weight.SIGMOID:
        p0 = torch.full_like(p0, -float(torch.log(torch.tensor(float(a.length)))))
    scale = a.dim ** -0.5

    def step() -> object:
        out, m, den = cpp.forward(q, k, v, p0, p1, scale, a.causal, None, weight)
        if backward:
            return cpp.backward(q, k, v, out, do, m, den, p0, p1, scale, a.causal, None, weight)
        return out
    return step


def sdpa(a: argparse.Namespace, backward: bool) -> Callable[[], object]:
    """One call of SDPA: the forward under no_grad, or forward then backward of <out, dO>."""
    q, k, v, do, _, _ = inputs(a)
    f = torch.nn.functional.scaled_dot_product_attention

    def step() -> object:
        if not backward:
            with torch.no_grad():
                return f(q, k, v, is_causal=a.causal)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = f(*leaves, is_causal=a.causal)
        return torch.autograd.grad(out, leaves, do)
    return step


def peak_memory_mib(weight: str, a: argparse.Namespace) -> float:
    """Peak RSS a forward+backward adds, in MiB, over a run of the same process that only
    allocates the inputs, outputs and gradients (a child process each, so peaks are fresh)."""
    def child(mode: str) -> int:
        cmd = [sys.executable, __file__, "--child", mode, "--weights", weight,
               "--batch", str(a.batch), "--heads", str(a.heads), "--length", str(a.length),
               "--dim", str(a.dim), "--threads", str(a.threads)]
        if a.causal:
            cmd.append("--causal")
        return int(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return (child("sdpa" if weight == "sdpa" else "kernel") - child("baseline")) / 1024


def child_main(a: argparse.Namespace) -> None:
    """Print this process's peak RSS in KiB after the kernel or the baseline allocations."""
    if a.child == "kernel":
        fused(Weight[a.weights.upper()], a, backward=True)()
    elif a.child == "sdpa":
        sdpa(a, backward=True)()
    else:  # the same inputs and what any implementation must hold: out, m, den, dq, dk, dv
        held = inputs(a)
        q = held[0]
        keep = [torch.empty_like(q) for _ in range(4)]
        keep += [torch.empty(q.shape[:3]) for _ in range(2)]
        for t in keep:
            t.fill_(0)
    # VmHWM, this address space's own peak: getrusage's ru_maxrss keeps the peak of the
    # process that exec'd this one (the parent, after its timing runs)
    with open("/proc/self/status") as status:
        print(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")))


def main() -> None:
    """Parse the options; print a table of medians and ratios against SDPA."""
    ap = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--weights", default=",".join(w.name.lower() for w in Weight))
    ap.add_argument("--child", choices=("kernel", "sdpa", "baseline"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.child:
        child_main(a)
        return
    weights = [Weight[w.strip().upper()] for w in a.weights.split(",")]
    print(f"fp32 B={a.batch} H={a.heads} L={a.length} D={a.dim} causal={a.causal} "
          f"threads={a.threads}, median of {a.repeat}; load average before "
          f"{os.getloadavg()[0]:.2f}")
    head = "| weight | fwd ms | SDPA fwd ms | fwd ratio | fwd+bwd ms | SDPA fwd+bwd ms | ratio |"
    if a.memory:
        head += " peak extra MiB |"
        print(f"SDPA forward+backward: peak extra {peak_memory_mib('sdpa', a):.2f} MiB")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for w in weights:
        base_f, fwd = median_times([sdpa(a, False), fused(w, a, False)], a.repeat)
        base_b, both = median_times([sdpa(a, True), fused(w, a, True)], a.repeat)
        row = (f"| {w.name.lower()} | {fwd * 1e3:.1f} | {base_f * 1e3:.1f} | {fwd / base_f:.2f}x "
               f"| {both * 1e3:.1f} | {base_b * 1e3:.1f} | {both / base_b:.2f}x |")
        if a.memory:
            row += f" {peak_memory_mib(w.name.lower(), a):.2f} |"
        print(row, flush=True)
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
