"""The native fused attention for every weight (elastic, softmax1, symax, stablemax, sigmoid,
cog) against SDPA on the CPU, forward and forward+backward, in one process; with --gate,
each weight's gated call against its ungated one.

    .venv/bin/python scripts/attention_family_cpu.py [--batch 2] [--heads 4] [--length 4096]
        [--dim 64] [--threads 1] [--repeat 5] [--causal] [--weights elastic,symax,...]
        [--gate] [--memory]

Issue 50's target: fp32, B=2, H=4, L=4096, D=64, one thread, every fused forward within 1.3x
of SDPA and forward+backward within 1.5x. Each figure is the median of --repeat calls after a
warm-up, SDPA's and the kernel's calls interleaved (one of each in turn) so both see the same
load on a shared machine (the load average is printed). The kernels are called through
elasticbench.attention.native_attention (the weights.py contract), SDPA through torch's
autograd, so the forward+backward figure of each is what a training step pays. --memory
adds, per weight, the peak resident memory a forward+backward adds over its inputs, outputs
and gradients, measured in a fresh child process, and SDPA's beside it (docs/native.md
section 5).
--gate adds a second table: each weight's call with an output gate (issue 58: within 1.05x
of the ungated call) as the autograd layer makes it, the forward keeping the ungated output
beside the gated one and the backward the ungated one on dO * gate with d gate = dO *
ungated, against the ungated call, interleaved the same way.
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

from elasticbench.attention import native_attention
from elasticbench.attention.weights import Weight

CLOCK = time.perf_counter  # --cpu-time: time.thread_time


def median_times(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """The median seconds (wall clock, or with --cpu-time this thread's CPU time, which a
    shared machine's other load disturbs less; one torch thread runs on this one) of
    `repeat` calls of each fn after one warm-up call of each, the calls interleaved (fns[0],
    fns[1], ..., fns[0], ...)."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeat):
        for fn, t in zip(fns, times, strict=True):
            start = CLOCK()
            fn()
            t.append(CLOCK() - start)
    return [statistics.median(t) for t in times]


def inputs(a: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    """q, k, v, dO and the per-(batch, head) parameters p_score, p_den (fp32, weights.py)."""
    g = torch.Generator().manual_seed(0)
    shape = (a.batch, a.heads, a.length, a.dim)
    q, k, v, do = (torch.randn(shape, generator=g) for _ in range(4))
    p_score = torch.full((a.batch, a.heads), 1.0)
    p_den = torch.full((a.batch, a.heads), 1.0)
    return q, k, v, do, p_score, p_den


def fused(weight: Weight, a: argparse.Namespace, backward: bool,
          gated: bool = False) -> Callable[[], object]:
    """One call of the native kernel for `weight`: the forward, or forward then backward;
    gated: with a (batch, heads, length, dim) gate, as the autograd layer calls it."""
    q, k, v, do, p_score, p_den = inputs(a)
    if weight is Weight.SIGMOID:
        p_score = torch.full_like(p_score, -float(torch.log(torch.tensor(float(a.length)))))
    scale = a.dim ** -0.5
    gate = torch.rand(q.shape, generator=torch.Generator().manual_seed(1)) if gated else None

    def step() -> object:
        if gate is None:
            out, m, den = native_attention.forward(q, k, v, p_score, p_den, scale, a.causal,
                                                   None, weight)
        else:
            out, m, den, *kept = native_attention.forward(q, k, v, p_score, p_den, scale,
                                                          a.causal, None, weight, gate=gate,
                                                          keep_ungated=backward)
        if not backward:
            return out
        if gate is None:
            return native_attention.backward(q, k, v, out, do, m, den, p_score, p_den, scale,
                                             a.causal, None, weight)
        dgate = do * kept[0]
        return dgate, native_attention.backward(q, k, v, kept[0], do * gate, m, den, p_score,
                                                p_den, scale, a.causal, None, weight)
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
    ap.add_argument("--gate", action="store_true", help="also time each weight gated")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by this thread's CPU time, not the wall clock (needs --threads 1)")
    ap.add_argument("--skip-sdpa", action="store_true", help="only the --gate table")
    ap.add_argument("--weights", default=",".join(w.name.lower() for w in Weight))
    ap.add_argument("--child", choices=("kernel", "sdpa", "baseline"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.cpu_time:
        if a.threads != 1:
            ap.error("--cpu-time measures one thread: give --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    if a.child:
        child_main(a)
        return
    weights = [Weight[w.strip().upper()] for w in a.weights.split(",")]
    print(f"fp32 B={a.batch} H={a.heads} L={a.length} D={a.dim} causal={a.causal} "
          f"threads={a.threads}, median of {a.repeat} "
          f"({'thread CPU time' if a.cpu_time else 'wall clock'}); load average before "
          f"{os.getloadavg()[0]:.2f}")
    head = "| weight | fwd ms | SDPA fwd ms | fwd ratio | fwd+bwd ms | SDPA fwd+bwd ms | ratio |"
    if a.memory:
        head += " peak extra MiB |"
        print(f"SDPA forward+backward: peak extra {peak_memory_mib('sdpa', a):.2f} MiB")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for w in weights if not a.skip_sdpa else ():
        base_f, fwd = median_times([sdpa(a, False), fused(w, a, False)], a.repeat)
        base_b, both = median_times([sdpa(a, True), fused(w, a, True)], a.repeat)
        row = (f"| {w.name.lower()} | {fwd * 1e3:.1f} | {base_f * 1e3:.1f} | {fwd / base_f:.2f}x "
               f"| {both * 1e3:.1f} | {base_b * 1e3:.1f} | {both / base_b:.2f}x |")
        if a.memory:
            row += f" {peak_memory_mib(w.name.lower(), a):.2f} |"
        print(row, flush=True)
    if a.gate:
        head = ("| weight | gated fwd ms | fwd ms | ratio | gated fwd+bwd ms | fwd+bwd ms "
                "| ratio |")
        print(f"load average {os.getloadavg()[0]:.2f}")
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for w in weights:
            plain_f, gated_f = median_times([fused(w, a, False), fused(w, a, False, True)],
                                            a.repeat)
            plain_b, gated_b = median_times([fused(w, a, True), fused(w, a, True, True)],
                                            a.repeat)
            print(f"| {w.name.lower()} | {gated_f * 1e3:.1f} | {plain_f * 1e3:.1f} | "
                  f"{gated_f / plain_f:.3f}x | {gated_b * 1e3:.1f} | {plain_b * 1e3:.1f} | "
                  f"{gated_b / plain_b:.3f}x |", flush=True)
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
