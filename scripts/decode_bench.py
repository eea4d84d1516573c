"""A decode step on the CPU: a few queries against a long key cache, the family's fused call
(causal="bottom_right": the queries sit at the end of the cached keys) beside SDPA's.

    .venv/bin/python scripts/decode_bench.py [--batch 1] [--heads 8] [--kv-heads 8]
        [--cache 4096] [--queries 1] [--dim 64] [--threads 1] [--rounds 30] [--calls 10]

fp32, no autograd (inference). Timed: SDPA (is_causal off at one query, where every cached
key is visible, else an explicit bottom-right bool mask); `elastic_attention(...,
causal="bottom_right")` on the native kernel (the whole public call); the native op alone
(kernels/cpp/attention.cpp's attention_forward).

Grouped-query attention (--kv-heads below --heads, dividing it): the cache holds --kv-heads
key and value heads, each shared by G = heads / kv_heads query heads. SDPA takes it with
enable_gqa=True. The family's calls take it as elasticbench.integrations.transformers does
with a parameter per query head: the G query heads of a key head folded into the batch,
q (B Hkv, G, Lq, D) against that key head broadcast across them (a stride-0 view of the
cache, which the native kernel reads in place), tau and beta (H,) folded the same way; and,
beside it, the packed decode step that integration takes when the parameters are one per key
head (Lq = 1): the G query heads as G queries of their key head, q (B, Hkv, G, D) against
the cache as it is. Each round times --calls calls of each in
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
    ap.add_argument("--kv-heads", type=_positive, default=None,
                    help="key and value heads (grouped-query attention; default --heads)")
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
    kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    if kv_heads > args.heads or args.heads % kv_heads:
        print(f"decode_bench: --kv-heads ({kv_heads}) must divide --heads ({args.heads})",
              file=sys.stderr)
        return 2
    why = devices.native_unavailable()
    if why is not None:
        print(f"decode_bench: the native kernels are not available here: {why}",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    b, h, lq, lk, d = args.batch, args.heads, args.queries, args.cache, args.dim
    hkv = kv_heads
    groups = h // hkv
    q = torch.randn(b, h, lq, d, generator=g)
    k, v = (torch.randn(b, hkv, lk, d, generator=g) for _ in "kv")
    tau, beta = torch.ones(h), torch.ones(h)
    mask = None if lq == 1 else (torch.arange(lk)[None, :] <= torch.arange(lq)[:, None]
                                 + lk - lq)
    ext = native.load()
    scale = d ** -0.5
    sdpa = torch.nn.functional.scaled_dot_product_attention
    # grouped: a key head's G query heads folded into the batch, the key head broadcast
    # across them (stride 0), the per-query-head parameters folded alike; G = 1 leaves all
    # as they are
    qf = q.reshape(b * hkv, groups, lq, d)
    kf, vf = (x.reshape(b * hkv, 1, lk, d).expand(-1, groups, -1, -1) for x in (k, v))
    tf, bf = (x.expand(b, h).reshape(b * hkv, groups, 1, 1) for x in (tau, beta))
    bh = torch.ones(b * hkv, groups)
    fns = {
        "sdpa": (lambda: sdpa(q, k, v, attn_mask=mask, enable_gqa=True)) if groups > 1
        else (lambda: sdpa(q, k, v, attn_mask=mask)),
        "elastic_attention": lambda: elastic_attention(qf, kf, vf, tau=tf, beta=bf,
                                                       causal="bottom_right"),
        "native op": lambda: ext.attention_forward(qf, kf, vf, bh, bh, scale, True, 256, 512,
                                                   None, 0, lk - lq),
    }
    if groups > 1 and lq == 1:  # one parameter per key head: G queries of each key head
        qp = q.reshape(b, hkv, groups, d)
        tp, bp = torch.ones(hkv), torch.ones(hkv)
        fns["elastic packed"] = lambda: elastic_attention(qp, k, v, tau=tp, beta=bp)
    with torch.no_grad(), dispatch.forcing("cpp"):
        got = measure(fns, args.rounds, args.calls)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    kv = f" Hkv={hkv}" if groups > 1 else ""
    print(f"decode step: B={b} H={h}{kv} Lq={lq} Lk={lk} D={d} fp32, {args.threads} thread(s), "
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
