"""What a call of the public API costs beside its kernel, on this machine's CPU (docs/dispatch.md
section 5): interleaved medians of torch's softmax, the public `elastic_softmax`, the module
`ElasticSoftmax` and the raw native kernel, forward and forward+backward, and of
`ElasticAttention` and `SymaxAttention` against SDPA, beside their native kernels' forward and
backward called alone (what the module adds is the difference), at three shapes: a tiny one,
where the call's fixed cost is nearly all of it, the distributed example's (8, 4, 32, 16)
(docs/distributed.md section 5) and (1, 4, 128, 64).

    python scripts/call_overhead.py [--threads 1] [--rounds 15] [--json PATH]

Each round times every variant once (a batch of calls long enough to read a clock), in an
order that rotates from round to round, so that a drift of the machine's speed falls on all
of them alike; the figure is each variant's median over the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from elasticbench import functional as F
from elasticbench import native
from elasticbench.nn import ElasticAttention, ElasticSoftmax, SymaxAttention


def _per_call(fn: Callable[[], object], seconds: float = 0.02) -> Callable[[], float]:
    """A timer of fn: calls it in a batch of about `seconds`, returns seconds per call."""
    fn()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        fn()
        calls += 1
    batch = max(1, calls)

    def timed() -> float:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        return (time.perf_counter() - t0) / batch

    return timed


def interleaved(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds per call of each variant, rounds interleaved and rotated."""
    timers = {name: _per_call(fn) for name, fn in variants.items()}
    names = list(timers)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(timers[name]())
    return {name: statistics.median(s) for name, s in samples.items()}


def rows(shape: tuple[int, int], rounds: int) -> dict[str, float]:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    xg = x.clone().requires_grad_()
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    module = ElasticSoftmax()
    variants: dict[str, Callable[[], object]] = {
        "torch.softmax fwd": lambda: torch.softmax(x, -1),
        "elastic_softmax fwd": lambda: F.elastic_softmax(x, 1.0, 1.0),
        "torch.softmax fwd+bwd": lambda: torch.softmax(xg, -1).backward(g),
        "ElasticSoftmax fwd+bwd": lambda: module(xg).backward(g),
    }
    if (ext := native.load() if native.unavailable() is None else None) is not None:
        y = F.elastic_softmax(x, 1.0, 1.0)
        variants["native kernel fwd"] = lambda: ext.exp_forward(
            x, ext.Structure.FUSED, True, float("-inf"), 1.0, 1.0)
        variants["native kernel fwd+bwd"] = lambda: (
            ext.exp_forward(x, ext.Structure.FUSED, True, float("-inf"), 1.0, 1.0),
            ext.exp_backward(x, y, g, True, 1.0, 1.0, True))
    return interleaved(variants, rounds)


def attention(shape: tuple[int, int, int, int], rounds: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(*shape, generator=gen).requires_grad_() for _ in range(3))
    dout = torch.randn(*shape, generator=gen)
    module = ElasticAttention(param_shape=(shape[1],))
    symax = SymaxAttention(param_shape=(shape[1],))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    variants: dict[str, Callable[[], object]] = {
        "SDPA fwd+bwd": lambda: sdpa(q, k, v).backward(dout),
        "ElasticAttention fwd+bwd": lambda: module(q, k, v).backward(dout),
        "SymaxAttention fwd+bwd": lambda: symax(q, k, v).backward(dout),
    }
    if (ext := native.load() if native.unavailable() is None else None) is not None:
        qd, kd, vd = (t.detach() for t in (q, k, v))
        p = torch.ones(shape[:2])
        scale = shape[3] ** -0.5

        def kernels(weight: int) -> Callable[[], object]:
            def run() -> object:  # the native forward and backward, no autograd around them
                out, m, den = ext.attention_forward(qd, kd, vd, p, p, scale, False, 256, 512,
                                                    None, weight, 0)
                return ext.attention_backward(qd, kd, vd, out, dout, m, den, p, p, scale,
                                              False, 256, 512, None, weight, 0)
            return run

        variants["native elastic fwd+bwd"] = kernels(0)
        variants["native symax fwd+bwd"] = kernels(2)
    return interleaved(variants, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out: dict[str, dict[str, float]] = {}
    for shape in ((8, 1024), (256, 4096)):
        out[f"rows {shape[0]}x{shape[1]}"] = rows(shape, args.rounds)
    for shape in ((1, 4, 4, 8), (8, 4, 32, 16), (1, 4, 128, 64)):
        out[f"attention {shape}"] = attention(shape, args.rounds)
    for section, times in out.items():
        base = times.get("torch.softmax fwd"), times.get("torch.softmax fwd+bwd")
        print(section)
        for name, t in times.items():
            ref = base[0] if "fwd+bwd" not in name else base[1]
            if section.startswith("attention"):
                ref = times["SDPA fwd+bwd"]
            print(f"  {name:28s} {t * 1e6:10.1f} us  {t / ref:6.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "seconds": out}, f,
                      indent=1)


if __name__ == "__main__":
    main()
