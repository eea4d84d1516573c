"""Time every configuration of the Triton attention kernel's tuning lists on a GPU.

    python3 scripts/gpu_attention_sweep.py [--json results/gpu/attention_sweep.json]
        [--dtypes bf16,fp16] [--dims 64,128] [--lengths 2048,4096,8192,16384]
        [--causal 0,1] [--tokens 32768] [--heads 16] [--budget 420]

For each dtype, head dim D, length L (batch B = tokens / L, H heads) and causality it times,
with triton.testing.do_bench (median, L2 flushed), the forward under every configuration of
attention_configs.configs("fwd", ...) and then its TMA ones (tma=True), and the backward
(preprocessing, dk/dv and dq launches) under every dk/dv configuration, pointer then TMA (dq
at its list's first), and every dq
configuration (dk/dv at its first); SDPA (torch's default backend) beside them for the same
shape. TFLOP/s: forward 4 B H L^2 D, backward 2.5 times that, both halved when causal. Each
configuration's output is compared with the first configuration's (max relative
difference), so a configuration that compiles to wrong code shows. The shape of the issue's
targets (bf16, D=128, L=8192) comes first; when --budget seconds are spent (compiling each
configuration takes a few seconds) the rest is left out and the JSON says so.

Without CUDA it prints one line and exits 0 (nothing to time).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=str(ROOT / "results/gpu/attention_sweep.json"))
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--dims", type=_ints, default=[128, 64])
    ap.add_argument("--lengths", type=_ints, default=[8192, 2048, 4096, 16384])
    ap.add_argument("--causal", type=_ints, default=[0, 1])
    ap.add_argument("--tokens", type=int, default=32768, help="B = tokens / L")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--budget", type=float, default=420.0, help="seconds, compiles included")
    args = ap.parse_args(argv)
    for name in args.dtypes.split(","):
        if name not in DTYPES:
            ap.error(f"--dtypes takes bf16 and fp16, got {name!r}")
    return args


def _flops(b: int, h: int, length: int, d: int, causal: bool, backward: bool) -> float:
    f = 4.0 * b * h * length * length * d * (2.5 if backward else 1.0)
    return f / 2 if causal else f


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _rel(a, b) -> float:
    """max |a - b| / max |b|."""
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _listed(ac, kernel: str, d: int, dtype, causal: bool) -> tuple:
    """Every configuration the tuner may pick for kernel: the pointer list, then the TMA
    list (empty where this Triton has no tensor descriptors)."""
    return ac.configs(kernel, d, dtype, causal) + ac.configs(kernel, d, dtype, causal, tma=True)


def _sweep_shape(dt: str, d: int, length: int, causal: bool, args: argparse.Namespace,
                 bench, device: str = "cuda") -> list[dict]:
    """The rows of one (dtype, head dim, length, causal): SDPA, then every configuration."""
    import torch

    from elasticbench.kernels.triton import attention_configs as ac
    from elasticbench.kernels.triton import flash_attention as kernel

    dev = torch.device(device)
    dtype = getattr(torch, DTYPES[dt])
    b, h = max(1, args.tokens // length), args.heads
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, length, d, device=dev, dtype=dtype, generator=g)
                   for _ in range(4))
    tau = torch.full((b, h), 0.8, device=dev)
    beta = torch.full((b, h), 1.0, device=dev)
    scale = 1 / math.sqrt(d)
    base = {"dtype": dt, "head_dim": d, "length": length, "batch": b, "heads": h,
            "causal": causal}
    fwd_flops = _flops(b, h, length, d, causal, False)
    bwd_flops = _flops(b, h, length, d, causal, True)
    rows: list[dict] = []
    ms = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                        is_causal=causal))
    rows.append({**base, "kernel": "sdpa_fwd", "tiles": None, "ms": ms,
                 "tflops": fwd_flops / ms / 1e9})
    first = None
    for t in _listed(ac, "fwd", d, dtype, causal):
        try:
            got = kernel.attention_forward(q, k, v, tau, beta, scale, causal, tile=t)
            first = first if first is not None else got
            ms = bench(lambda t=t: kernel.attention_forward(q, k, v, tau, beta, scale, causal,
                                                            tile=t))
            rows.append({**base, "kernel": "fwd", "tiles": str(t), "ms": ms,
                         "tflops": fwd_flops / ms / 1e9,
                         "rel_diff_vs_first": _rel(got[0], first[0])})
        except Exception as e:  # one line per configuration that does not run here
            rows.append({**base, "kernel": "fwd", "tiles": str(t), "error": repr(e)[:300]})
    if first is None:
        return rows
    out, m, den = first
    kv0 = ac.configs("dkdv", d, dtype, causal)[0]
    q0 = ac.configs("dq", d, dtype, causal)[0]
    pairs = [("dkdv", (t, q0)) for t in _listed(ac, "dkdv", d, dtype, causal)]
    pairs += [("dq", (kv0, t)) for t in _listed(ac, "dq", d, dtype, causal)[1:]]
    ref = None
    for which, tiles in pairs:
        t = tiles[0] if which == "dkdv" else tiles[1]
        try:
            grads = kernel.attention_backward(q, k, v, out, do, m, den, tau, beta, scale,
                                              causal, tiles=tiles)
            ref = ref if ref is not None else grads
            ms = bench(lambda tiles=tiles: kernel.attention_backward(
                q, k, v, out, do, m, den, tau, beta, scale, causal, tiles=tiles))
            rows.append({**base, "kernel": f"bwd[{which}]", "tiles": str(t), "ms": ms,
                         "tflops": bwd_flops / ms / 1e9,
                         "rel_diff_vs_first": max(_rel(x, y) for x, y in
                                                  zip(grads[:3], ref[:3], strict=True))})
        except Exception as e:
            rows.append({**base, "kernel": f"bwd[{which}]", "tiles": str(t),
                         "error": repr(e)[:300]})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_attention_sweep: no CUDA device here, nothing timed")
        return 0
    import triton
    from triton.testing import do_bench

    start = time.monotonic()
    rows: list[dict] = []
    left_out: list[str] = []

    def bench(fn) -> float:
        return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))

    shapes = [(dt, d, length, bool(c)) for dt in args.dtypes.split(",") for d in args.dims
              for length in args.lengths for c in args.causal]
    for dt, d, length, causal in shapes:
        what = f"{dt} D={d} L={length} {'causal' if causal else 'full'}"
        if time.monotonic() - start > args.budget:
            left_out.append(what)
            continue
        got = _sweep_shape(dt, d, length, causal, args, bench)
        rows.extend(got)
        for row in got:
            if "ms" in row:
                print(f"{what:28s} {row['kernel']:10s} {row['tiles'] or '-':14s} "
                      f"{row['ms']:8.3f} ms {row['tflops']:6.1f} TFLOP/s", flush=True)
            else:
                print(f"{what:28s} {row['kernel']:10s} {row['tiles']:14s} {row['error']}")
    best: dict[str, dict] = {}
    for row in rows:
        if "ms" not in row or row["tiles"] is None:
            continue
        key = (f"{row['kernel']} {row['dtype']} D={row['head_dim']} L={row['length']} "
               f"causal={int(row['causal'])}")
        if key not in best or row["ms"] < best[key]["ms"]:
            best[key] = {"tiles": row["tiles"], "ms": row["ms"], "tflops": row["tflops"]}
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "commit": _commit(),
              "seconds": round(time.monotonic() - start, 1), "left_out": left_out,
              "best": best, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"gpu_attention_sweep: {len(rows)} timings, {len(left_out)} shapes left out "
          f"(budget), written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
