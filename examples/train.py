"""Train one small transformer with each attention function of the family, side by side.

    python examples/train.py --attention sdpa,elastic,softmax1,symax,stablemax,sigmoid \\
        --task chars,reverse --json train.json --table table.md --plot train.png
    python examples/train.py --device cuda --dtype bf16

Tasks (nothing is downloaded): `chars`, a causal character-level language model on the source
of a few standard-library modules of the running Python (the last tenth held out for
evaluation), and `reverse`, a toy task without a causal mask (reverse a sequence of random
tokens). The model: token and position embeddings, pre-norm layers of multi-head attention and
an MLP, a linear head. For every function the weights start from the same seed (an attention's
own parameters take nothing from the generator), the batches come in the same order, and the
evaluation batch is the same.

Every `--every` steps each run prints its evaluation loss and token accuracy, its learned
attention parameters (tau and beta for elastic, eta for symax, the bias for sigmoid) and
milliseconds per step (the median of the training steps after `--warmup`, the evaluation not
counted; the table adds this process's CPU time per step, what a step costs on a CPU shared
with other work). At each evaluation the attention weights of every layer on the evaluation batch are
probed (elasticbench.attention.composite.attention_weights; softmax's with torch.softmax): the
mean weight on the first key (the attention sink), the share of visible keys with weight
exactly 0, the entropy of each query's weights (normalized to sum 1, divided by the log of
the number of keys it sees, so 1 is uniform) and the total weight per query (1 for softmax and
stablemax; below 1 where the function allows it). A summary table ends the output;
--json, --table and --plot (matplotlib) write the curves, the table and a figure.
docs/family_training.md has them for the first command above, and what they show.

--device cuda trains on the GPU (the batches are still drawn on the CPU, so both devices see
the same data); --dtype bf16 or fp16 runs the forward under torch.autocast in that dtype with
the parameters kept in fp32, fp16 with a GradScaler. A bad option, or cuda where none is
available, is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from elasticbench.attention.autograd import choose
from elasticbench.attention.composite import attention_weights, scores
from elasticbench.attention.layout import visible
from elasticbench.attention.weights import Weight
from elasticbench.nn import (
    ElasticAttention,
    SigmoidAttention,
    Softmax1Attention,
    StablemaxAttention,
    SymaxAttention,
)

KINDS = ("sdpa", "elastic", "softmax1", "symax", "stablemax", "sigmoid")
TASKS = ("chars", "reverse")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# ---------------------------------------------------------------------------------- data

# Modules whose source is the character model's text: present in every Python >= 3.10, and
# nearly all ASCII (a character outside printable ASCII and newline is one "other" token).
TEXT_MODULES = ("argparse", "difflib", "textwrap", "functools", "dataclasses", "inspect")


def stdlib_text(modules: tuple[str, ...] = TEXT_MODULES) -> str:
    """The source files of `modules`, concatenated in that order."""
    parts = []
    for name in modules:
        path = getattr(importlib.import_module(name), "__file__", None)
        if path is None or not path.endswith(".py"):
            raise ValueError(f"module {name} has no Python source file here")
        parts.append(Path(path).read_text(encoding="utf-8"))
    return "".join(parts)


def encode(text: str) -> torch.Tensor:
    """Character ids: newline 0, printable ASCII 1..95, anything else 96 (97 in all)."""
    ids = [0 if c == "\n" else ord(c) - 31 if 32 <= ord(c) < 127 else 96 for c in text]
    return torch.tensor(ids, dtype=torch.long)


class Task(NamedTuple):
    """A batch source: `batch(n, generator, split)` gives (inputs, targets), each (n, length)."""

    name: str
    vocab: int
    length: int
    causal: bool
    batch: Callable[[int, torch.Generator, str], tuple[torch.Tensor, torch.Tensor]]
    about: str = ""


def chars_task(length: int) -> Task:
    ids = encode(stdlib_text())
    cut = int(0.9 * len(ids))
    splits = {"train": ids[:cut], "eval": ids[cut:]}
    if len(splits["eval"]) <= length + 1:
        raise ValueError(f"--length {length} is longer than the held-out text")

    def batch(n: int, gen: torch.Generator, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        text = splits[split]
        starts = torch.randint(0, len(text) - length - 1, (n,), generator=gen)
        window = text[starts[:, None] + torch.arange(length + 1)]
        return window[:, :-1], window[:, 1:]  # predict each next character

    about = (f"{len(ids)} characters of {', '.join(TEXT_MODULES)} (Python "
             f"{'.'.join(map(str, sys.version_info[:3]))}), last 10% held out")
    return Task("chars", 97, length, True, batch, about)


def reverse_task(length: int, vocab: int) -> Task:
    def batch(n: int, gen: torch.Generator, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, vocab, (n, length), generator=gen)
        return x, x.flip(1)

    return Task("reverse", vocab, length, False, batch,
                f"reverse {length} random tokens of {vocab}")


# ---------------------------------------------------------------------------------- model

class Probe(NamedTuple):
    """How a function's attention weights are recomputed from q and k: the Weight and its two
    parameters (p0, p1) as elasticbench.attention.weights documents them, or None for
    softmax (torch.softmax of the scores)."""

    weight: Weight | None
    # p0, p1 and the learned parameters to report (name -> one value per head), each from
    # the attention module and the number of keys
    p0: Callable[[nn.Module, int], torch.Tensor | float]
    p1: Callable[[nn.Module, int], torch.Tensor | float]
    params: Callable[[nn.Module, int], dict[str, torch.Tensor]] = lambda m, n: {}


def make_attention(kind: str, heads: int, causal: bool) -> nn.Module | None:
    """The attention module of `kind` (None: torch's SDPA), per-head parameters where it
    has any. Its parameters are constants at construction: they draw nothing from torch's
    generator, so every kind's model starts from the same weights."""
    if kind == "sdpa":
        return None
    if kind == "elastic":
        return ElasticAttention(param_shape=(heads,), causal=causal)
    if kind == "softmax1":
        return Softmax1Attention(causal=causal)
    if kind == "symax":
        return SymaxAttention(eta=1.0, learnable=True, param_shape=(heads,), causal=causal)
    if kind == "stablemax":
        return StablemaxAttention(causal=causal)
    if kind == "sigmoid":
        return SigmoidAttention(bias=None, learnable=True, param_shape=(heads,), causal=causal)
    raise ValueError(f"unknown attention {kind!r}")


def _zero(m: nn.Module, n: int) -> float:
    return 0.0


PROBES: dict[str, Probe] = {
    "sdpa": Probe(None, _zero, _zero),
    "elastic": Probe(Weight.ELASTIC, lambda m, n: m.tau, lambda m, n: m.beta,
                     lambda m, n: {"tau": m.tau, "beta": m.beta}),
    "softmax1": Probe(Weight.SOFTMAX1, _zero, _zero),
    "symax": Probe(Weight.SYMAX, _zero, lambda m, n: m.eta, lambda m, n: {"eta": m.eta}),
    "stablemax": Probe(Weight.STABLEMAX, _zero, _zero),
    # the bias is -ln(Lk) + a learned shift: it depends on the number of keys
    "sigmoid": Probe(Weight.SIGMOID, lambda m, n: m.bias(n), _zero,
                     lambda m, n: {"bias": m.bias(n)}),
}


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, kind: str, causal: bool):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.kind, self.causal = kind, causal
        self.fn = make_attention(kind, heads, causal)
        self.probe = PROBES[kind]
        self.keep = False  # set: forward keeps q and k for attention_weights
        self.seen: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        q, k, v = (t.view(b, length, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, -1))
        if self.keep:
            self.seen = (q.detach(), k.detach())
        if self.fn is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            o = self.fn(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, length, d))

    def weights(self) -> torch.Tensor:
        """The (B, H, L, L) attention weights of the last kept forward, in fp32 or wider."""
        q, k = self.seen
        scale = 1.0 / math.sqrt(q.shape[-1])
        if self.probe.weight is None:
            return torch.softmax(scores(q, k, scale, self.causal), dim=-1)
        p0, p1 = (_detached(f(self.fn, k.shape[2])) for f in (self.probe.p0, self.probe.p1))
        return attention_weights(self.probe.weight, q, k, p0=p0, p1=p1, scale=scale,
                                 causal=self.causal)

    def params(self, length_k: int) -> dict[str, torch.Tensor]:
        """The learned parameters, each one value per head, for length_k keys."""
        return {} if self.fn is None else {
            n: v.detach().float().flatten().cpu()
            for n, v in self.probe.params(self.fn, length_k).items()}


def _detached(value: torch.Tensor | float) -> torch.Tensor | float:
    return value.detach() if isinstance(value, torch.Tensor) else value


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, kind: str, causal: bool):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, kind, causal)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class Model(nn.Module):
    def __init__(self, vocab: int, length: int, d: int, heads: int, layers: int, kind: str,
                 causal: bool = False):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(length, d) * 0.1)
        self.layers = nn.ModuleList(Layer(d, heads, kind, causal) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    def attentions(self) -> list[Attention]:
        return [layer.attn for layer in self.layers]

    def params(self) -> dict[str, torch.Tensor]:
        """Each learned attention parameter over every layer and head."""
        out: dict[str, list[torch.Tensor]] = {}
        for a in self.attentions():
            for name, value in a.params(self.pos.shape[0]).items():
                out.setdefault(name, []).append(value)
        return {name: torch.cat(values) for name, values in out.items()}


# ---------------------------------------------------------------------------------- probes

def weight_stats(w: torch.Tensor, causal: bool) -> dict[str, float]:
    """What the weights w (B, H, L, L) of one layer do, over the queries that see two keys or
    more: the mean weight on key 0 (`sink`), the share of visible keys with weight exactly 0
    (`zero`), the mean normalized entropy (in [0, 1], over queries with a positive total),
    the mean and least total weight per query, and the share of queries with total 0
    (`empty`). `uniform_sink` is what uniform weights would put on key 0. NaN weights give
    NaN statistics (nothing is filtered)."""
    length_q, length_k = w.shape[-2:]
    seen = (visible(length_q, length_k, w.device) if causal
            else torch.ones(length_q, length_k, dtype=torch.bool, device=w.device))
    n = seen.sum(-1)
    rows = n >= 2
    w = w.double()[..., rows, :]
    seen, n = seen[rows], n[rows].double()
    total = w.sum(-1)
    live = total > 0
    p = w / torch.where(live, total, 1.0).unsqueeze(-1)
    entropy = -torch.xlogy(p, p).sum(-1) / n.log()
    zeros = ((w == 0) & seen).sum() / (seen.sum() * w.shape[0] * w.shape[1])
    return {
        "sink": w[..., 0].mean().item(),
        "uniform_sink": (1 / n).mean().item(),
        "zero": zeros.item(),
        "entropy": entropy[live].mean().item() if live.any() else math.nan,
        "total": total.mean().item(),
        "total_min": total.min().item(),
        "empty": (~live).double().mean().item(),
    }


def evaluate(model: Model, x: torch.Tensor, y: torch.Tensor, vocab: int,
             autocast) -> dict[str, float]:
    """Loss, token accuracy and the attention probes (averaged over layers) on (x, y)."""
    model.eval()
    for a in model.attentions():
        a.keep = True
    try:
        with torch.no_grad(), autocast():
            logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1)).item()
            stats = [weight_stats(a.weights(), a.causal) for a in model.attentions()]
    finally:
        for a in model.attentions():
            a.keep, a.seen = False, None
        model.train()
    out = {"loss": loss, "acc": (logits.argmax(-1) == y).float().mean().item()}
    for key in stats[0]:
        out[key] = statistics.fmean(s[key] for s in stats)
    out["total_min"] = min(s["total_min"] for s in stats)
    return out


# ---------------------------------------------------------------------------------- training

def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def build_model(kind: str, task: Task, args: argparse.Namespace) -> Model:
    torch.manual_seed(args.seed)
    return Model(task.vocab, task.length, args.d_model, args.heads, args.layers, kind,
                 task.causal).to(args.device)


def _param_text(params: dict[str, torch.Tensor]) -> str:
    return "".join(f"  {n} {v.min():.3f}..{v.max():.3f}" for n, v in params.items())


def train(kind: str, task: Task, steps: int, args: argparse.Namespace) -> dict:
    """Train `kind` on `task` for `steps` steps; the curves and the final probes."""
    model = build_model(kind, task, args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # fp16's narrow range needs the loss scaled (a no-op when disabled); bf16 does not
    scaler = torch.amp.GradScaler(args.device, enabled=args.dtype == "fp16")

    def autocast():
        return (nullcontext() if args.dtype == "fp32"
                else torch.autocast(args.device, dtype=DTYPES[args.dtype]))

    data = torch.Generator().manual_seed(args.seed)
    ex, ey = (t.to(args.device) for t in task.batch(
        args.eval_batch, torch.Generator().manual_seed(args.seed + 1), "eval"))
    label = kind if len(args.task) == 1 else f"{kind}/{task.name}"
    evals = [{"step": 0, **evaluate(model, ex, ey, task.vocab, autocast),
              "params": {n: v.tolist() for n, v in model.params().items()}}]
    losses, times, cpu_times = [], [], []
    for step in range(1, steps + 1):
        x, y = (t.to(args.device) for t in task.batch(args.batch, data, "train"))
        synchronize(args.device)
        start, cpu_start = time.perf_counter(), time.process_time()
        with autocast():
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, task.vocab), y.reshape(-1))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        synchronize(args.device)
        if step > args.warmup:
            times.append(time.perf_counter() - start)
            # this process's CPU time (all its threads): what the step costs whatever else
            # the machine runs; on a GPU, only the host's share
            cpu_times.append(time.process_time() - cpu_start)
        losses.append(loss.item())
        if step % args.every == 0 or step == steps:
            params = model.params()
            ev = evaluate(model, ex, ey, task.vocab, autocast)
            evals.append({"step": step, **ev, "params": {n: v.tolist() for n, v in params.items()}})
            ms = f"{1e3 * statistics.median(times):.1f} ms/step" if times else "warming up"
            print(f"{label:9s} step {step:5d}  loss {ev['loss']:.4f}  acc {ev['acc']:6.1%}"
                  f"{_param_text(params)}  {ms}", flush=True)
    return {"attention": kind, "task": task.name, "steps": steps, "train_loss": losses,
            "ms_per_step": 1e3 * statistics.median(times),
            "ms_per_step_mean": 1e3 * statistics.fmean(times), "timed_steps": len(times),
            "cpu_ms_per_step": 1e3 * statistics.median(cpu_times), "device": args.device,
            "evals": evals, "model_parameters": sum(p.numel() for p in model.parameters()),
            "implementation": implementation(model, x, DTYPES[args.dtype])}


def implementation(model: Model, tokens: torch.Tensor, dtype: torch.dtype) -> str:
    """Which implementation computes the model's attention on these tokens with q in dtype:
    torch's SDPA, or the one elasticbench's dispatch picks (native C++, Triton, torch)."""
    a = model.attentions()[0]
    if a.probe.weight is None:
        return "torch sdpa"
    d = model.tok.embedding_dim // a.heads
    q = torch.empty(tokens.shape[0], a.heads, tokens.shape[1], d, device=tokens.device,
                    dtype=dtype)
    return choose(q, a.probe.weight).name


# ---------------------------------------------------------------------------------- report

def table(runs: list[dict]) -> str:
    """A markdown table per task: the last evaluation of every run."""
    lines = []
    for task in dict.fromkeys(r["task"] for r in runs):
        rs = [r for r in runs if r["task"] == task]
        last = rs[0]["evals"][-1]
        lines += [f"**{task}** ({rs[0]['steps']} steps; uniform weights would put "
                  f"{last['uniform_sink']:.3f} on the first key)", "",
                  "| attention | kernel | eval loss | eval acc | ms/step | CPU ms/step | "
                  "first-key weight | zero share | entropy | total weight (mean, min) | "
                  "learned parameters |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            e = r["evals"][-1]
            params = ", ".join(f"{n} {min(v):.3g}..{max(v):.3g}" for n, v in e["params"].items())
            lines.append(f"| {r['attention']} | {r['implementation']} | {e['loss']:.3f} | "
                         f"{e['acc']:.1%} | "
                         f"{r['ms_per_step']:.1f} | {r['cpu_ms_per_step']:.1f} | "
                         f"{e['sink']:.3f} | {e['zero']:.3f} | "
                         f"{e['entropy']:.3f} | {e['total']:.3f}, {e['total_min']:.3f} | "
                         f"{params or '-'} |")
        lines.append("")
    return "\n".join(lines)


def plot(runs: list[dict], path: str) -> None:
    """Against the step, one line per attention: per task two rows of panels, the evaluation
    loss (with the training loss, averaged over 25 steps, faint), accuracy, first-key
    weight, total weight, entropy, zero share, and the learned parameters' means."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in runs))
    panels = (("loss", "loss (eval; train faint)"), ("acc", "eval token accuracy"),
              ("sink", "weight on the first key"), ("total", "total weight per query"),
              ("entropy", "entropy / log(keys seen)"), ("zero", "share of weights exactly 0"),
              ("positive", "tau, beta (elastic), eta (symax)"), ("bias", "bias (sigmoid)"))
    fig, axes = plt.subplots(2 * len(tasks), 4, figsize=(16, 6.4 * len(tasks)), squeeze=False)
    colors = dict(zip(KINDS, plt.get_cmap("tab10").colors, strict=False))
    styles = {"tau": "-", "beta": "--", "eta": "-."}
    for t, task in enumerate(tasks):
        ax = {key: axes[2 * t + i // 4, i % 4] for i, (key, _) in enumerate(panels)}
        for r in (r for r in runs if r["task"] == task):
            steps = [e["step"] for e in r["evals"]]
            color = colors[r["attention"]]
            for key in ("loss", "acc", "sink", "total", "entropy", "zero"):
                ax[key].plot(steps, [e[key] for e in r["evals"]], color=color,
                             label=r["attention"])
            train = torch.tensor(r["train_loss"])
            if len(train) >= 25:
                smooth = train.unfold(0, 25, 1).mean(-1)
                ax["loss"].plot(range(25, len(train) + 1), smooth, color=color, alpha=0.3,
                                linewidth=0.8)
            for name in r["evals"][0]["params"]:
                ax["bias" if name == "bias" else "positive"].plot(
                    steps, [statistics.fmean(e["params"][name]) for e in r["evals"]],
                    color=color, linestyle=styles.get(name, "-"),
                    label=f"{r['attention']} {name}")
        uniform = next(r for r in runs if r["task"] == task)["evals"][0]["uniform_sink"]
        ax["sink"].axhline(uniform, color="gray", linestyle=":", linewidth=1)
        ax["sink"].annotate("uniform", (0, uniform), fontsize=7, color="gray")
        for key, title in panels:
            ax[key].set_title(f"{task}: {title}", fontsize=10)
            ax[key].set_xlabel("step", fontsize=8)
            if ax[key].lines and key in ("acc", "positive", "bias"):
                ax[key].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------- command

class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _names(allowed: tuple[str, ...], what: str):
    def parse(text: str) -> list[str]:
        names = list(allowed) if text == "all" else [n.strip() for n in text.split(",")]
        bad = [n for n in names if n not in allowed]
        if bad or not names or len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give distinct {what} from {', '.join(allowed)} (or all)")
        return names
    return parse


DEFAULT_STEPS = {"chars": 1000, "reverse": 600}
DEFAULT_LENGTH = {"chars": 64, "reverse": 16}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--attention", type=_names(KINDS, "functions"), default=["sdpa", "elastic"],
                   help=f"comma-separated, from {','.join(KINDS)} (or all); default sdpa,elastic")
    p.add_argument("--task", type=_names(TASKS, "tasks"), default=["chars"],
                   help="comma-separated, from chars,reverse (or all); default chars")
    p.add_argument("--steps", type=int, help="training steps (default: chars 1000, reverse 600)")
    p.add_argument("--every", type=int, default=50, help="evaluate and print every N steps")
    p.add_argument("--warmup", type=int,
                   help="first steps trained but not timed (default: 10, or half of --steps)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--eval-batch", type=int, default=32)
    p.add_argument("--length", type=int, help="sequence length (default: chars 64, reverse 16)")
    p.add_argument("--vocab", type=int, default=10, help="the reverse task's vocabulary")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                   help="autocast dtype (fp32: none); parameters stay fp32")
    p.add_argument("--json", help="write every run's curves and probes here")
    p.add_argument("--table", help="write the summary table (markdown) here")
    p.add_argument("--plot", help="write the figure (PNG, needs matplotlib) here")
    args = p.parse_args(argv)
    if (args.steps is not None and args.steps < 1) or args.every < 1 or (
            args.warmup is not None and args.warmup < 0):
        p.error("--steps and --every must be at least 1, --warmup at least 0")
    for name in ("batch", "eval_batch", "d_model", "heads", "layers", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if (args.length is not None and args.length < 2) or args.vocab < 2:
        p.error("--length and --vocab must be at least 2")
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    fewest = min(args.steps or DEFAULT_STEPS[t] for t in args.task)
    if args.warmup is None:
        args.warmup = min(10, fewest // 2)
    elif fewest <= args.warmup:
        p.error(f"--steps must exceed --warmup ({args.warmup}): ms per step is timed after it")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda: no CUDA device is available here (torch {torch.__version__})")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib (pip install elasticbench[plot])")
    return args


def run(args: argparse.Namespace) -> dict:
    """Every (task, attention) pair in order; the document --json writes."""
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    start, cpu_start = time.perf_counter(), time.process_time()
    runs, tasks = [], []
    for name in args.task:
        length = args.length or DEFAULT_LENGTH[name]
        task = chars_task(length) if name == "chars" else reverse_task(length, args.vocab)
        tasks.append({"task": name, "about": task.about, "length": length})
        for kind in args.attention:
            runs.append(train(kind, task, args.steps or DEFAULT_STEPS[name], args))
    return {"runs": runs, "tasks": tasks, "options": vars(args), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu_start,
            "load_before": load, "load_after": os.getloadavg()}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    try:
        doc = run(args)
    except ValueError as e:  # e.g. a function this checkout does not have yet
        print(f"train.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    text = table(doc["runs"])
    print(f"\n{text}{doc['seconds']:.0f} s in all ({doc['cpu_seconds']:.0f} s of CPU time), "
          f"{doc['threads']} thread(s), load average {doc['load_before'][0]:.2f} before, "
          f"{doc['load_after'][0]:.2f} after")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.table:
        Path(args.table).write_text(text)
    if args.plot:
        plot(doc["runs"], args.plot)


if __name__ == "__main__":
    main()
