"""Time one training step of a small causal transformer with SDPA, Elastic and flex attention.

    python3 scripts/train_step.py [--attention sdpa,elastic,flex] [--compile none|only|both]
                                  [--json PATH] [--device cuda] [--dtype bf16] ...

One step is the forward (token and position embeddings, `--layers` pre-norm layers of causal
multi-head attention and a 4x GELU MLP, a final LayerNorm, a linear head, next-token cross
entropy), the backward and an optimizer step (AdamW by default), under torch.autocast in
`--dtype` with fp32 parameters (fp16 adds a GradScaler). Defaults: 4 layers, d_model 1024,
16 heads, batch 8, length 2048, bf16, cuda. The attention of each variant:

  sdpa     torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
  elastic  elasticbench.nn.ElasticAttention(param_shape=(heads,), causal=True)
  flex     Elastic attention composed from torch's flex_attention (examples/flex_elastic.py):
           score_mod where(score >= 0, score / tau[h], -inf), a causal BlockMask, the
           log-sum-exp, out * sigmoid(lse - log beta); tau and beta learnable per head,
           log-parametrised as ElasticAttention. flex_attention is fused only when compiled,
           so on CUDA the flex variant calls torch.compile(flex_attention) even when the rest
           of the model runs eagerly (as users write it); elsewhere it calls it eagerly.

`--compile only|both` adds (or, for only, times just) variants whose forward and loss go
through torch.compile (the backward through AOTAutograd; the optimizer step stays eager).
Each variant starts from the same weights (same seed) and batch, runs `--warmup` steps,
then `--repeats` runs of `--steps` steps, synchronized (CUDA events on a GPU, perf_counter
elsewhere); its figure is the median over the repeats of ms per step, its ratio is to the
eager SDPA variant's, and on CUDA its peak allocated memory is reported. A variant that fails
(flex_attention missing or refusing this device, a compile error, out of memory) is reported
with a one-line reason and the others still run. After the eager variants, the flex
composition is compared with elasticbench's elastic_attention on this device (forward and
gradients, small fp32 inputs, the kernel the eager flex variant calls; the forward alone where
torch refuses the backward); the errors are printed and go into the JSON. `--json PATH` is rewritten after each variant, so a run cut short keeps what it
measured.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from elasticbench.nn import ElasticAttention

KINDS = ("sdpa", "elastic", "flex")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str):
    """examples/<name>.py as the module `name`, loaded by path once (examples/ is not a
    package): flex_elastic, and train, whose model this script times."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and NamedTuples look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def flex_kernel(device: str, compiled_model: bool):
    """The flex_attention the flex variant calls: compiled on CUDA in an eager model (the
    fused kernel), torch's own inside a compiled model (traced with it) or off CUDA."""
    fe = example("flex_elastic")
    if device == "cuda" and not compiled_model:
        return fe.compiled_flex_attention()
    return fe.flex_module().flex_attention


class Attention(example("train").MultiHead):
    """Causal multi-head attention of a variant: SDPA, or the attention module of elastic
    and flex called as users call it."""

    def __init__(self, d: int, heads: int, kind: str, kernel=None):
        super().__init__(d, heads)
        if kind == "elastic":
            self.inner = ElasticAttention(param_shape=(heads,), causal=True)
        elif kind == "flex":
            self.inner = example("flex_elastic").FlexElasticAttention(
                param_shape=(heads,), causal=True, kernel=kernel)
        else:
            self.inner = None

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  x: torch.Tensor) -> torch.Tensor:
        if self.inner is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.inner(q, k, v)


def build_model(args: argparse.Namespace, kind: str, compiled: bool = False) -> nn.Module:
    """The model of `kind` on args.device, examples/train.py's with a final LayerNorm and
    position embeddings of std 0.02, its weights drawn from args.seed (the same for every
    kind: the attentions draw no random numbers)."""
    kernel = flex_kernel(args.device, compiled) if kind == "flex" else None
    torch.manual_seed(args.seed)
    model = example("train").Model(
        args.vocab, args.length, args.d_model, args.layers,
        lambda: Attention(args.d_model, args.heads, kind, kernel), pos_std=0.02,
        final_norm=True).to(args.device)
    for m in model.modules():
        if hasattr(m, "prepare"):  # FlexElasticAttention: its BlockMask, before any trace
            m.prepare(args.length, args.length, args.device)
    return model


def make_batch(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens from args.seed (drawn on the CPU, so the same on every device): the
    inputs and their next tokens."""
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, args.vocab, (args.batch, args.length + 1), generator=g)
    return tokens[:, :-1].to(args.device), tokens[:, 1:].to(args.device)


def autocast(args: argparse.Namespace):
    if args.dtype == "fp32":
        return nullcontext()
    return torch.autocast(args.device, dtype=DTYPES[args.dtype])


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
            args: argparse.Namespace) -> torch.Tensor:
    """Next-token cross entropy of model on (x, y) under args' autocast."""
    with autocast(args):
        logits = model(x)
    return F.cross_entropy(logits.float().reshape(-1, args.vocab), y.reshape(-1))


def make_step(model: nn.Module, args: argparse.Namespace, compiled: bool):
    """One training step, as a function of the batch returning the (pre-step) loss."""
    params = list(model.parameters())
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=args.lr)
    else:
        opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    scaler = torch.amp.GradScaler(args.device, enabled=args.dtype == "fp16")

    def forward(x, y):
        return loss_of(model, x, y, args)

    fwd = torch.compile(forward) if compiled else forward

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return step


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(step, x, y, args: argparse.Namespace, row: dict | None = None
               ) -> tuple[list[float], list[float]]:
    """ms per step of each repeat, and the loss of every step run (warm-up included); the
    first step's ms (compiles included, synchronized) into row["first_step_ms"]."""
    losses = []
    synchronize(args.device)
    t0 = time.perf_counter()
    for i in range(args.warmup):
        losses.append(step(x, y))
        if i == 0:
            synchronize(args.device)
            if row is not None:
                row["first_step_ms"] = 1e3 * (time.perf_counter() - t0)
    synchronize(args.device)
    per_step = []
    for _ in range(args.repeats):
        if args.device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.steps):
                losses.append(step(x, y))
            end.record()
            end.synchronize()
            per_step.append(start.elapsed_time(end) / args.steps)
        else:
            synchronize(args.device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                losses.append(step(x, y))
            synchronize(args.device)
            per_step.append(1e3 * (time.perf_counter() - t0) / args.steps)
    return per_step, [float(v) for v in losses]


def one_line(e: BaseException) -> str:
    """The exception's type and the first nonblank line of its message, at most 240 chars."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def run_variant(kind: str, compiled: bool, args: argparse.Namespace) -> dict:
    """Build, warm up and time one variant; its figures, or status "failed" and the reason."""
    name = kind + ("+compile" if compiled else "")
    row: dict = {"variant": name, "attention": kind, "compiled": compiled, "status": "ok"}
    if kind == "flex":
        row["note"] = ("flex_attention torch.compile'd" if args.device == "cuda" or compiled
                       else "flex_attention eager (dense)")
    model = step = None
    try:
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        model = build_model(args, kind, compiled)
        x, y = make_batch(args)
        step = make_step(model, args, compiled)
        per_step, losses = time_steps(step, x, y, args, row)
        if not all(math.isfinite(v) for v in losses):
            raise FloatingPointError(f"a loss is not finite: {losses}")
        row.update(ms_per_step=statistics.median(per_step), ms_repeats=per_step,
                   first_loss=losses[0], last_loss=losses[-1], losses=losses)
        if args.device == "cuda":
            row["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    except Exception as e:  # one variant failing must not stop the others
        row.update(status="failed", reason=one_line(e))
    finally:
        del model, step
        gc.collect()
        if compiled:
            torch._dynamo.reset()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return row


def flex_check(args: argparse.Namespace) -> dict:
    """The flex composition against elastic_attention on args.device (fp32, causal; the
    kernel the eager flex variant uses): max normwise relative errors, or the reason it could
    not run. Skipped unless the flex variant is asked for."""
    try:
        fe = example("flex_elastic")
        kernel = flex_kernel(args.device, compiled_model=False)
        return {"status": "ok", "max_rel_error": fe.max_rel_errors(args.device, kernel=kernel)}
    except Exception as e:
        reason = one_line(e)
    try:  # the forward alone (torch 2.13 runs flex_attention's forward on CPU, not backward)
        errors = fe.max_rel_errors(args.device, kernel=kernel, grads=False)
    except Exception:
        return {"status": "failed", "reason": reason}
    return {"status": "forward only", "max_rel_error": errors, "reason": reason}


def device_name(args: argparse.Namespace) -> str:
    if args.device == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu ({torch.get_num_threads()} threads of {os.cpu_count()} cores)"


def report(rows: list[dict]) -> list[str]:
    base = next((r["ms_per_step"] for r in rows
                 if r["variant"] == "sdpa" and r["status"] == "ok"), None)
    lines = [f"{'variant':16s} {'ms/step':>10s} {'vs sdpa':>8s} {'peak MiB':>9s} "
             f"{'first loss':>10s}  note"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['variant']:16s} failed: {r['reason']}")
            continue
        ratio = f"{r['ms_per_step'] / base:.2f}x" if base else "-"
        peak = f"{r['peak_mib']:.0f}" if "peak_mib" in r else "-"
        lines.append(f"{r['variant']:16s} {r['ms_per_step']:10.2f} {ratio:>8s} {peak:>9s} "
                     f"{r['first_loss']:10.4f}  {r.get('note', '')}")
    return lines


def add_ratios(rows: list[dict]) -> None:
    base = next((r["ms_per_step"] for r in rows
                 if r["variant"] == "sdpa" and r["status"] == "ok"), None)
    for r in rows:
        if r["status"] == "ok":
            r["ratio_to_sdpa"] = r["ms_per_step"] / base if base else None


def write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="train_step.py", description=__doc__.splitlines()[0])
    p.add_argument("--attention", default="sdpa,elastic,flex",
                   help="comma list of sdpa, elastic, flex")
    p.add_argument("--compile", choices=("none", "only", "both"), default="none",
                   help="time torch.compile'd variants: none, only them, or both")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16",
                   help="autocast dtype (fp32: no autocast); parameters stay fp32")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (at least 1)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    p.add_argument("--no-check", action="store_true",
                   help="skip comparing the flex composition with elastic_attention")
    p.add_argument("--json", help="write the figures, device, torch version and options here")
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.attention.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        p.error(f"--attention: {', '.join(bad) or 'nothing'} not among {', '.join(KINDS)}")
    args.kinds = list(dict.fromkeys(kinds))
    for name in ("layers", "d_model", "heads", "batch", "length", "vocab", "warmup", "steps",
                 "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available here (torch "
                f"{torch.__version__}); pass --device cpu")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # said once by torch on the first eager call; the table's note says it already
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = {"none": (False,), "only": (True,), "both": (False, True)}[args.compile]
    doc = {"device": device_name(args), "torch": torch.__version__,
           "cuda": torch.version.cuda, "options": {k: v for k, v in vars(args).items()},
           "variants": []}
    print(f"{doc['device']}, torch {doc['torch']}: {args.layers} layers, d_model "
          f"{args.d_model}, {args.heads} heads, batch {args.batch}, length {args.length}, "
          f"{args.dtype}, {args.optimizer}; median of {args.repeats} x {args.steps} steps "
          f"after {args.warmup}", flush=True)
    for compiled in modes:
        for kind in args.kinds:
            doc["variants"].append(run_variant(kind, compiled, args))
            add_ratios(doc["variants"])
            if args.json:
                write_json(args.json, doc)
        if "flex" in args.kinds and not args.no_check and "flex_check" not in doc:
            # after the eager variants, whose figures come first should a limit cut the run
            doc["flex_check"] = c = flex_check(args)
            print("flex vs elastic_attention (fp32, max rel. error): "
                  + ", ".join(f"{k} {v:.1e}" for k, v in c.get("max_rel_error", {}).items())
                  + ("" if c["status"] == "ok" else f" ({c['status']}: {c['reason']})"),
                  flush=True)
            if args.json:
                write_json(args.json, doc)
    print("\n".join(report(doc["variants"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
