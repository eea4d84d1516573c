"""Key-padding-masked ElasticAttention against SDPA given the same mask, forward and
forward+backward, in one process and (by default) one thread.

    .venv/bin/python scripts/key_padding_bench.py [--batch 2] [--heads 4] [--length 1024]
        [--dim 64] [--padded 0.5] [--threads 1] [--repeat 7]

The mask is (batch, 1, 1, length) bool, the last `--padded` share of every batch's keys
False; both take it as attn_mask. ElasticAttention routes it to the fused kernel, which skips
the padded keys; SDPA computes every score and masks it. Each figure is the least of
--repeat calls after a warm-up, SDPA timed right before ElasticAttention each time so both
see the same load; the load average is printed beside them (the figures are for a shared
machine).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch

from elasticbench.nn import ElasticAttention


def best(fn: Callable[[], object], repeat: int) -> float:
    """The least wall-clock seconds of `repeat` calls of fn after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Parse the options, build the inputs and the mask, print both timings and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--padded", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(a.batch, a.heads, a.length, a.dim, generator=g) for _ in range(3))
    kept = a.length - int(a.padded * a.length)
    mask = (torch.arange(a.length) < kept)[None, None, None, :].expand(a.batch, 1, 1, -1)
    attn = ElasticAttention(tau=1.0, beta=1.0, param_shape=(a.heads,))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def both(fn: Callable[..., torch.Tensor]) -> Callable[[], object]:
        def step() -> None:
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            fn(*leaves, attn_mask=mask).sum().backward()
        return step

    print(f"B={a.batch} H={a.heads} L={a.length} D={a.dim} fp32, {a.threads} thread(s), "
          f"{a.length - kept} of {a.length} keys padded")
    for name, e_fn, s_fn in (
            ("forward", lambda: attn(q, k, v, attn_mask=mask),
             lambda: sdpa(q, k, v, attn_mask=mask)),
            ("forward+backward", both(attn), both(sdpa))):
        with torch.no_grad() if name == "forward" else torch.enable_grad():
            ts, te = [], []
            for _ in range(3):  # interleaved: both see the same load
                ts.append(best(s_fn, a.repeat))
                te.append(best(e_fn, a.repeat))
        s, e = min(ts), min(te)
        print(f"{name:17s} SDPA {s * 1e3:8.2f} ms  ElasticAttention {e * 1e3:8.2f} ms  "
              f"ratio {e / s:5.2f}  (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
