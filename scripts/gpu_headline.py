"""The headline timings of issue 55, each written to figures.jsonl as it is measured.

    python3 scripts/gpu_headline.py [--budget S] [--json PATH]

1. Attention, bf16, B=4 H=16 L=8192 D=128, not causal then causal: the public
   elastic_attention (tau = beta = 1), SDPA pinned to cuDNN and to flash, and Elastic
   attention composed from torch.compile(flex_attention) (examples/flex_elastic.py); forward
   (nothing needs a gradient) and backward (autograd.grad of a kept graph). Each unit's first
   call (compiles included, synchronized, perf_counter) is reported apart from its warm
   median (triton.testing.do_bench, L2 flushed). TFLOP/s counts the matmuls: forward
   4 B H L^2 D, backward 2.5 times that, both halved when causal. The Elastic forward and
   backward carry the launches the library noted (elasticbench.launches: the configuration
   each kernel launched) and the issue's targets (not causal: forward <= 4.4 ms, backward
   <= 12.5 ms), reported, not judged.
2. Rows, 4096 x 4096, bf16 and fp32: the module ElasticSoftmax() against torch.softmax,
   forward and backward, and a device-to-device copy of the input timed in the same run:
   % of copy = copy time / kernel time (forward reads x and writes y, as the copy does;
   the backward reads x, y and dy and writes dx: twice the copy's traffic).

The not-causal attention comes first (the issue's targets), then the rows, then causal
attention, then the FlexAttention composition (not causal, causal: its compiles take longest). When --budget seconds are spent no new unit starts; the JSON lists what was left.
Exit 1 when an Elastic unit (ours) failed; a baseline that fails (cuDNN refusing a shape,
flex_attention missing) is a figure with its error, not a failure of this step. In the dry
run (GPU_CHECKS_DRY_RUN=1) the shapes are tiny, the device the CPU, the timer a
perf_counter median.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_figures import Figures, dry_run, one_line, timer, work_file

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = {("fwd", False): 4.4, ("bwd", False): 12.5}  # issue 55's targets, not causal


class Timer:
    """First call and warm median of a callable, on CUDA or (dry run) the CPU."""

    def __init__(self, device: str):
        self.device = device

    def sync(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def first(self, fn: Callable[[], Any]) -> float:
        """ms of the first call, compiles included, synchronized."""
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return 1e3 * (time.perf_counter() - t0)

    def warm(self, fn: Callable[[], Any]) -> float:
        """ms of a warm call (gpu_figures.timer: do_bench's median on CUDA)."""
        return timer(self.device == "cuda")(fn)


class Headline:
    def __init__(self, args: argparse.Namespace):
        import torch

        self.args = args
        self.dry = dry_run()
        self.device = "cpu" if self.dry else "cuda"
        self.timer = Timer(self.device)
        self.figures = Figures()
        self.start = time.monotonic()
        self.failed = 0
        self.doc: dict[str, Any] = {"device": self.device, "torch": torch.__version__,
                                    "units": [], "left_out": []}
        self.path = args.json or work_file("headline.json")

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.start)

    def save(self) -> None:
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.doc, f, indent=1, default=str)
            os.replace(tmp, self.path)

    def unit(self, name: str, fn: Callable[[], Any], ours: bool, flops: float | None = None,
             traffic_copies: float | None = None, copy_ms: float | None = None,
             **fields: Any) -> float | None:
        """Time fn (first call, then warm) and record both; None where it failed or the
        budget is spent."""
        if self.left() <= 0:
            self.doc["left_out"].append(name)
            self.save()
            return None
        from elasticbench import launches

        rec: dict[str, Any] = {"name": name, **fields}
        try:
            with launches.noting() as notes:
                rec["first_ms"] = self.timer.first(fn)
            rec["launches"] = launches.summary(notes)
            rec["ms"] = self.timer.warm(fn)
            rec["status"] = "ok"
        except Exception as e:
            rec.update(status="failed", error=one_line(e), ms=None)
            self.failed += ours
            if self.device == "cuda":
                import torch

                torch.cuda.empty_cache()
        ms = rec.get("ms")
        if ms and flops:
            rec["tflops"] = flops / (ms * 1e-3) / 1e12
        if ms and traffic_copies and copy_ms:
            rec["pct_copy"] = 100 * traffic_copies * copy_ms / ms
        self.doc["units"].append(rec)
        self.save()
        extra = {k: rec[k] for k in ("tflops", "pct_copy", "launches", "error")
                 if rec.get(k) is not None}
        self.figures.add(f"{name} first call", rec.get("first_ms"), "ms", status=rec["status"],
                         **{k: v for k, v in fields.items() if k in ("shape", "dtype")})
        self.figures.add(name, ms, "ms", status=rec["status"], **fields, **extra)
        print(f"  {name:52} first {rec.get('first_ms') or float('nan'):9.2f} ms  warm "
              f"{ms or float('nan'):9.3f} ms"
              + (f"  {rec['tflops']:6.1f} TFLOP/s" if rec.get("tflops") else "")
              + (f"  {rec['pct_copy']:5.1f}% of copy" if rec.get("pct_copy") else "")
              + (f"  {rec['error']}" if rec.get("error") else "")
              + (f"  [{rec['launches']}]" if rec.get("launches") else ""), flush=True)
        return ms


def flex_elastic() -> Any:
    """examples/flex_elastic.py, loaded by path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("flex_elastic",
                                                  ROOT / "examples" / "flex_elastic.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["flex_elastic"] = module
    spec.loader.exec_module(module)
    return module


def attention(h: Headline, causal: bool, flex_only: bool = False) -> None:
    """The attention units of one causality: elastic_attention and SDPA's two backends
    (flex_only False), or the FlexAttention composition alone (its compiles take the longest,
    so it comes after everything else)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from elasticbench.functional import elastic_attention

    b, heads, length, d = (1, 2, 32, 16) if h.dry else (4, 16, 8192, 128)
    dev, dt = h.device, torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v, dout = (torch.randn(b, heads, length, d, generator=g, device=dev, dtype=dt)
                     for _ in range(4))
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    fwd_flops = 4 * b * heads * length * length * d / (2 if causal else 1)
    shape = [b, heads, length, d]

    def sdpa(backend: Any) -> Callable[..., Any]:
        def call(*qkv: Any) -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(*qkv, is_causal=causal)
        return call

    def elastic(*qkv: Any) -> Any:
        return elastic_attention(*qkv, tau=1.0, beta=1.0, causal=causal)

    impls: list[tuple[str, Callable[..., Any] | None, bool, str | None]] = [
        ("elastic_attention", elastic, True, None),
        ("sdpa_cudnn", sdpa(SDPBackend.CUDNN_ATTENTION), False, None),
        ("sdpa_flash", sdpa(SDPBackend.FLASH_ATTENTION), False, None)]
    if flex_only:
        try:
            fe = flex_elastic()
            kernel = fe.compiled_flex_attention() if dev == "cuda" else None
            mask = fe.causal_block_mask(length, length, dev) if causal else None

            def flex(*qkv: Any) -> Any:
                return fe.flex_elastic_attention(*qkv, 1.0, 1.0, block_mask=mask,
                                                 kernel=kernel)

            impls = [("flex_elastic", flex, False, None)]
        except Exception as e:  # flex_attention missing here: a figure with the reason
            impls = [("flex_elastic", None, False, one_line(e))]
    tag = "causal" if causal else "not causal"
    for mode in ("fwd", "bwd"):
        for name, fn, ours, why in impls:
            label = f"attention {mode} {tag} {name}"
            fields = {"shape": shape, "dtype": "bf16", "causal": causal, "mode": mode}
            if name == "elastic_attention" and (mode, causal) in TARGET_MS:
                fields["target_ms"] = TARGET_MS[(mode, causal)]
            if fn is None:
                h.figures.add(label, None, "ms", status="failed", error=why, **fields)
                continue
            flops = fwd_flops * (2.5 if mode == "bwd" else 1.0)
            if mode == "fwd":
                h.unit(label, lambda fn=fn: fn(q, k, v), ours, flops, **fields)
                continue
            try:
                out = fn(*leaves)
            except Exception as e:  # the forward failed: the backward cannot be timed
                h.figures.add(label, None, "ms", status="failed", error=one_line(e), **fields)
                h.failed += ours
                continue
            h.unit(label, lambda out=out: torch.autograd.grad(out, leaves, dout,
                                                              retain_graph=True),
                   ours, flops, **fields)
            del out


def rows(h: Headline) -> None:
    import torch

    from elasticbench.nn import ElasticSoftmax

    rows_, n = (8, 64) if h.dry else (4096, 4096)
    g = torch.Generator(device=h.device).manual_seed(1)
    kinds = (("bf16", torch.bfloat16), ("fp32", torch.float32))
    for dn, dt in kinds[:1] if h.dry else kinds:  # the dry run: plumbing, once
        x = torch.randn(rows_, n, generator=g, device=h.device, dtype=dt)
        dy = torch.randn(rows_, n, generator=g, device=h.device, dtype=dt)
        fields = {"shape": [rows_, n], "dtype": dn}
        copy_ms = h.unit(f"rows copy {dn}", lambda x=x: x.clone(), False, **fields)
        module = ElasticSoftmax().to(h.device)
        xr = x.detach().requires_grad_(True)
        for name, fn in (("ElasticSoftmax", module), ("torch.softmax",
                                                       lambda t: torch.softmax(t, -1))):
            ours = name == "ElasticSoftmax"
            h.unit(f"rows fwd {name} {dn}", lambda fn=fn, x=x: fn(x), ours,
                   traffic_copies=1, copy_ms=copy_ms, **fields)
            try:
                y = fn(xr)
                inputs = [xr, *(module.parameters() if ours else ())]
            except Exception as e:
                h.figures.add(f"rows bwd {name} {dn}", None, "ms", status="failed",
                              error=one_line(e), **fields)
                h.failed += ours
                continue
            h.unit(f"rows bwd {name} {dn}",
                   lambda y=y, inputs=inputs, dy=dy: torch.autograd.grad(y, inputs, dy,
                                                                  retain_graph=True),
                   ours, traffic_copies=2, copy_ms=copy_ms, **fields)
            del y


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=200.0,
                   help="seconds after which no new unit starts (default 200)")
    p.add_argument("--json", help="write every unit here, as it is measured")
    args = p.parse_args(argv)
    import torch

    if not dry_run() and not torch.cuda.is_available():
        print("gpu_headline.py: no CUDA device here (the dry run is GPU_CHECKS_DRY_RUN=1)",
              file=sys.stderr)
        return 2
    # said once by torch when flex_attention runs eagerly (the dry run's CPU)
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    h = Headline(args)
    parts = [lambda: attention(h, False), lambda: rows(h), lambda: attention(h, True),
             lambda: attention(h, False, flex_only=True),
             lambda: attention(h, True, flex_only=True)]
    # the dry run: causal is the same plumbing
    for part in parts[:2] + parts[3:4] if h.dry else parts:
        try:
            part()
            if h.device == "cuda":
                torch.cuda.empty_cache()  # the part's tensors are gone with its frame
        except Exception as e:  # one part failing must not stop the others
            h.failed += 1
            h.figures.add("headline part", None, "ms", status="failed", error=one_line(e))
            print(f"  a part failed: {one_line(e)}", flush=True)
    if h.doc["left_out"]:
        print(f"budget spent: left out {', '.join(h.doc['left_out'])}")
    print(f"headline: {len(h.doc['units'])} units timed, {h.failed} of ours failed in "
          f"{time.monotonic() - h.start:.0f} s")
    return 1 if h.failed else 0


if __name__ == "__main__":
    sys.exit(main())
