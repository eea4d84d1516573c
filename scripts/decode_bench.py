"""A decode step on the CPU: a few queries against a long key cache, the family's fused call
(causal="bottom_right": the queries sit at the end of the cached keys) beside SDPA's.

    .venv/bin/python scripts/decode_bench.py [--batch 1] [--heads 8] [--cache 4096]
        [--queries 1] [--dim 64] [--threads 1] [--rounds 30] [--calls 10]

fp32, no autograd (inference). Timed: SDPA (is_causal off at one query, where every cached
key is visible, else an explicit bottom-right bool mask); `elastic_attention(...,
causal="bottom_right")` on the native kernel (the whole public call); the native op alone
(kernels/cpp/attention.cpp's attention_forward). Each round times --calls calls of each in
turn (so all see the same load), on two clocks: wall and the thread's CPU time
(time.thread_time, which a shared machine's other processes do not inflate); printed per
call, the least and the median over the rounds, with the ratio to SDPA. A report, never a
pass/fail figure (docs/attention.md section 7).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

from elasticbench import devices, dispatch, native
from elasticbench.functional import elastic_attention


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def measure(fns: dict[str, Callable[[], object]], rounds: int, calls: int
            ) -> dict[str, dict[str, list[float]]]:
    """Per name, the seconds per call of each round on the wall and thread-CPU clocks."""
    out: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in fns}
    for fn in fns.values():  # warm-up: the first calls load and allocate
        for _ in range(3):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            w0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                fn()
            out[name]["wall"].append((time.perf_counter() - w0) / calls)
            out[name]["cpu"].append((time.thread_time() - c0) / calls)
    return out


def main() -> int:
    """Parse the options, time the three calls, print the table; 2 on bad input."""
    ap = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    ap.add_argument("--batch", type=_positive, default=1)
    ap.add_argument("--heads", type=_positive, default=8)
    ap.add_argument("--cache", type=_positive, default=4096, help="cached keys (Lk)")
    ap.add_argument("--queries", type=_positive, default=1, help="queries per step (Lq)")
    ap.add_argument("--dim", type=_positive, default=64)
    ap.add_argument("--threads", type=_positive, default=1)
    ap.add_argument("--rounds", type=_positive, default=30)
    ap.add_argument("--calls", type=_positive, default=10)
    args = ap.parse_args()
    if args.queries > args.cache:
        print(f"decode_bench: --queries ({args.queries}) must not exceed --cache "
              f"({args.cache})", file=sys.stderr)
        return 2
    why = devices.native_unavailable()
    if why is not None:
        print(f"decode_bench: the native kernels are not available here: {why}",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    b, h, lq, lk, d = args.batch, args.heads, args.queries, args.cache, args.dim
    q = torch.randn(b, h, lq, d, generator=g)
    k, v = (torch.randn(b, h, lk, d, generator=g) for _ in "kv")
    tau, beta = torch.ones(h), torch.ones(h)
    mask = None if lq == 1 else (torch.arange(lk)[None, :] <= torch.arange(lq)[:, None]
                                 + lk - lq)
    ext = native.load()
    bh = torch.ones(b, h)
    scale = d ** -0.5
    fns = {
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                         attn_mask=mask),
        "elastic_attention": lambda: elastic_attention(q, k, v, tau=tau, beta=beta,
                                                       causal="bottom_right"),
        "native op": lambda: ext.attention_forward(q, k, v, bh, bh, scale, True, 256, 512,
                                                   None, 0, lk - lq),
    }
    with torch.no_grad(), dispatch.forcing("cpp"):
        got = measure(fns, args.rounds, args.calls)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"decode step: B={b} H={h} Lq={lq} Lk={lk} D={d} fp32, {args.threads} thread(s), "
          f"{args.rounds} rounds of {args.calls} calls, load average {load:.1f}")
    base = {c: (min(got["sdpa"][c]), statistics.median(got["sdpa"][c])) for c in ("wall", "cpu")}
    print(f"{'call':20s} {'wall min':>10s} {'wall med':>10s} {'cpu min':>10s} {'cpu med':>10s}"
          f" {'cpu med / sdpa':>15s}")
    for name, clocks in got.items():
        wmin, wmed = min(clocks["wall"]), statistics.median(clocks["wall"])
        cmin, cmed = min(clocks["cpu"]), statistics.median(clocks["cpu"])
        print(f"{name:20s} {wmin * 1e6:8.1f}us {wmed * 1e6:8.1f}us {cmin * 1e6:8.1f}us "
              f"{cmed * 1e6:8.1f}us {cmed / base['cpu'][1]:14.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
