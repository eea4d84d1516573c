"""Train one small transformer with each attention function of the family, side by side.

    python examples/train.py --attention all --gate both --task all --jobs 2 \\
        --results results/family_training --plot docs/family_training.png
    python examples/train.py --device cuda --dtype bf16

Tasks (nothing is downloaded): `chars`, a causal character-level language model on the source
of a few standard-library modules of the running Python (the last tenth held out for
evaluation); `reverse`, a toy task without a causal mask (reverse a sequence of random
tokens); and `signed`, a task where the sign of a key's contribution depends on the query
and the key together. Its tokens belong to `--groups` groups (default 8) paired 0-1, 2-3,
...; at each position i the target is

    #{j : group_j = group_i} - #{j : group_j = pair(group_i)}     (over all L positions)

(as a class, + L: 2L + 1 classes), so for a query of group g a key of group g counts +1,
one of its paired group -1 and every other key 0: relevant, anti-relevant and irrelevant.
The same key is +1 for one query and -1 for another, so no value computed from the key
alone carries the sign: one softmax head's output, a convex combination of values, cannot
be the signed count; a model gets it by putting the key's group into its value and
leaving the subtraction to what follows (the MLP, another head), or with signed weights (cog:
+ on the query's group, - on its pair, 0 elsewhere) in one head. No mask, random groups: a
small model learns it in a few hundred steps.

The model: token and position embeddings, pre-norm layers of multi-head attention and an
MLP, a linear head, trained with AdamW at the rate --lr (--schedule linear: falling linearly
from --lr to 0 at the last step). With --gate, each attention's output is multiplied elementwise by a
gate computed from the layer's (normalized) input x, as Qiu et al. ("Gated Attention for
Large Language Models") place it: g = sigmoid(x W_g + b_g) per head and channel, W_g zero
at the start and b_g = +4 (g = 0.982, near the ungated model), passed as `gate=` to the
functional attention (SDPA's output is multiplied by it). For every (function, gate) the
weights start from the same seed (an attention's own parameters and the gate's take nothing
from the generator), the batches come in the same order, and the evaluation batch is the
same. `--heads` takes one count or several (default: 4 for chars and reverse, 1 and 4 for
signed), `--gate` off, on or both.

Every `--every` steps each run prints its evaluation loss and token accuracy, its learned
attention parameters (tau and beta for elastic, eta for symax, the bias for sigmoid, the
gate's bias per head) and milliseconds per step (the median of the training steps after
`--warmup`, the evaluation not counted; the table adds this process's CPU time per step,
what a step costs on a CPU shared with other work). At each evaluation the attention
weights of every layer on the evaluation batch are probed
(elasticbench.attention.composite.attention_weights; softmax's with torch.softmax): the mean
weight on the first key (the attention sink), the shares of visible keys with weight exactly
0 and with a negative weight, the entropy of each query's |weights| (normalized to sum 1,
divided by the log of the number of keys it sees, so 1 is uniform), the total (signed)
weight per query (1 for softmax and stablemax; below 1 where the function allows it), the
gate's mean value and its share below 0.1; on `signed`, per layer and head, the mean
weight per key on the query's own group, its paired group and the other groups. A summary
table ends the output; --json, --table, --results and --plot (matplotlib) write the curves,
the table, the results files docs/family_training.md shows, and a figure.
docs/family_training.md has them for the first command above, and what they show.

--jobs N trains N runs at a time in forked processes (each with --threads threads); the
CPU time reported is that of all of them. --device cuda trains on the GPU (the batches are
still drawn on the CPU, so both devices see the same data); --dtype bf16 or fp16 runs the
forward under torch.autocast in that dtype with the parameters kept in fp32, fp16 with a
GradScaler. A bad option, or cuda where none is available, is one line on stderr and exit
status 2.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import json
import math
import multiprocessing
import os
import platform
import resource
import shlex
import statistics
import subprocess
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
from elasticbench.attention.operands import visible
from elasticbench.attention.weights import Weight
from elasticbench.functional import (
    cog_attention,
    elastic_attention,
    sigmoid_attention,
    softmax1_attention,
    stablemax_attention,
    symax_attention,
)
from elasticbench.nn import (
    CogAttention,
    ElasticAttention,
    SigmoidAttention,
    Softmax1Attention,
    StablemaxAttention,
    SymaxAttention,
)

KINDS = ("sdpa", "elastic", "softmax1", "symax", "stablemax", "sigmoid", "cog")
TASKS = ("chars", "reverse", "signed")
GATES = {"off": (False,), "on": (True,), "both": (False, True)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROLES = ("same", "paired", "other")  # a key's group against the query's, on `signed`
GATE_BIAS = 4.0  # sigmoid(4) = 0.982: a gated model starts near the ungated one

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
    """A batch source: `batch(n, generator, split)` gives (inputs, targets), each (n, length).
    `roles`, where the task has them, maps inputs (n, L) to each (query, key) pair's role
    (n, L, L): an index into ROLES."""

    name: str
    vocab: int
    length: int
    causal: bool
    batch: Callable[[int, torch.Generator, str], tuple[torch.Tensor, torch.Tensor]]
    about: str = ""
    roles: Callable[[torch.Tensor], torch.Tensor] | None = None


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


def signed_roles(x: torch.Tensor) -> torch.Tensor:
    """For group tokens x (n, L), groups paired 2p <-> 2p + 1: (n, L, L) with, at (i, j), 0
    where key j is in query i's group (i itself included), 1 where it is in the paired
    group, 2 elsewhere."""
    same = x[:, :, None] == x[:, None, :]
    paired = (x[:, :, None] ^ 1) == x[:, None, :]
    return torch.where(same, 0, torch.where(paired, 1, 2))


def signed_target(x: torch.Tensor) -> torch.Tensor:
    """The signed count at each position of x (n, L): keys of the query's group (itself
    included) minus keys of its paired group, in [2 - L, L]."""
    roles = signed_roles(x)
    return (roles == 0).sum(-1) - (roles == 1).sum(-1)


def signed_task(length: int, groups: int) -> Task:
    if groups < 2 or groups % 2 or groups > 2 * length + 1:
        raise ValueError(f"--groups {groups}: an even number from 2 to 2 * length + 1 "
                         f"({2 * length + 1})")

    def batch(n: int, gen: torch.Generator, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, groups, (n, length), generator=gen)
        return x, signed_target(x) + length  # a class in 2..2L

    return Task("signed", 2 * length + 1, length, False, batch,
                f"{length} random tokens of {groups} groups paired 0-1, 2-3, ...: at each "
                f"position, the tokens of its group minus those of the paired group "
                f"({2 * length + 1} classes)", signed_roles)


def make_task(name: str, args: argparse.Namespace) -> Task:
    """The task `name` at the options' sizes."""
    length = args.length or DEFAULT_LENGTH[name]
    if name == "chars":
        return chars_task(length)
    if name == "reverse":
        return reverse_task(length, args.vocab)
    return signed_task(length, args.groups)


# ---------------------------------------------------------------------------------- model

class Probe(NamedTuple):
    """How a function's attention weights are recomputed from q and k: the Weight and its two
    parameters (p_score, p_den) as elasticbench.attention.weights names them, or None for
    softmax (torch.softmax of the scores)."""

    weight: Weight | None
    # p_score, p_den and the learned parameters to report (name -> one value per head), each from
    # the attention module and the number of keys
    p_score: Callable[[nn.Module, int], torch.Tensor | float]
    p_den: Callable[[nn.Module, int], torch.Tensor | float]
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
    if kind == "cog":
        return CogAttention(causal=causal)
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
    "cog": Probe(Weight.COG, _zero, _zero),
}

# The functional call of each kind with its module's current parameters (the module holds
# them; the functional form takes the gate tensor).
CALLS: dict[str, Callable[..., torch.Tensor]] = {
    "elastic": lambda m, q, k, v, **kw: elastic_attention(q, k, v, tau=m.tau, beta=m.beta,
                                                          **kw),
    "softmax1": lambda m, q, k, v, **kw: softmax1_attention(q, k, v, **kw),
    "symax": lambda m, q, k, v, **kw: symax_attention(q, k, v, eta=m.eta, **kw),
    "stablemax": lambda m, q, k, v, **kw: stablemax_attention(q, k, v, **kw),
    "sigmoid": lambda m, q, k, v, **kw: sigmoid_attention(q, k, v, bias=m.bias(k.shape[2]),
                                                          **kw),
    "cog": lambda m, q, k, v, **kw: cog_attention(q, k, v, **kw),
}


class MultiHead(nn.Module):
    """The projections of multi-head attention around an attention of (q, k, v): x (B, L, d)
    to q, k and v of `heads` heads, each (B, heads, L, d / heads), and the attention's
    output merged and projected back to (B, L, d). A subclass gives `attention`."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def split(self, t: torch.Tensor) -> torch.Tensor:
        """(B, L, d) to (B, heads, L, d / heads)."""
        b, length, _ = t.shape
        return t.view(b, length, self.heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        q, k, v = (self.split(t) for t in self.qkv(x).chunk(3, -1))
        return self.out(self.attention(q, k, v, x).transpose(1, 2).reshape(b, length, d))

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  x: torch.Tensor) -> torch.Tensor:
        """The attention of (q, k, v), each (B, heads, L, D), of the layer's input x."""
        raise NotImplementedError


class Attention(MultiHead):
    """Multi-head attention of one kind; with `gate`, its output times g = sigmoid(x W_g +
    b_g) (W_g (d, d) from 0, b_g from GATE_BIAS; both constants at construction)."""

    def __init__(self, d: int, heads: int, kind: str, causal: bool, gate: bool = False):
        super().__init__(d, heads)
        self.kind, self.causal = kind, causal
        self.fn = make_attention(kind, heads, causal)
        self.probe = PROBES[kind]
        self.gate_weight = nn.Parameter(torch.zeros(d, d)) if gate else None
        self.gate_bias = nn.Parameter(torch.full((d,), GATE_BIAS)) if gate else None
        self.keep = False  # set: forward keeps q, k and the gate for the probes
        self.seen: tuple[torch.Tensor, torch.Tensor] | None = None
        self.seen_gate: torch.Tensor | None = None

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  x: torch.Tensor) -> torch.Tensor:
        """`attend`, gated by x's gate where there is one; q, k and the gate kept for the
        probes while `keep` is set."""
        gate = None
        if self.gate_weight is not None:
            gate = self.split(torch.sigmoid(x @ self.gate_weight + self.gate_bias))
        if self.keep:
            self.seen = (q.detach(), k.detach())
            self.seen_gate = None if gate is None else gate.detach()
        return self.attend(q, k, v, gate)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               gate: torch.Tensor | None) -> torch.Tensor:
        """The attention of (q, k, v), each (B, H, L, D), times gate (B, H, L, D) if given."""
        if self.fn is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            return o if gate is None else o * gate
        kwargs = {"causal": self.causal} if gate is None else {"causal": self.causal,
                                                               "gate": gate}
        return CALLS[self.kind](self.fn, q, k, v, **kwargs)

    def weights(self) -> torch.Tensor:
        """The (B, H, L, L) attention weights of the last kept forward, in fp32 or wider."""
        q, k = self.seen
        scale = 1.0 / math.sqrt(q.shape[-1])
        if self.probe.weight is None:
            return torch.softmax(scores(q, k, scale, self.causal), dim=-1)
        p_score, p_den = (_detached(f(self.fn, k.shape[2]))
                          for f in (self.probe.p_score, self.probe.p_den))
        return attention_weights(self.probe.weight, q, k, p_score=p_score, p_den=p_den,
                                 scale=scale, causal=self.causal)

    def params(self, length_k: int) -> dict[str, torch.Tensor]:
        """The learned parameters, each one value per head, for length_k keys; the gate's
        bias as its mean over the head's channels."""
        out = {} if self.fn is None else {
            n: v.detach().float().flatten().cpu()
            for n, v in self.probe.params(self.fn, length_k).items()}
        if self.gate_bias is not None:
            out["gate_bias"] = self.gate_bias.detach().float().view(self.heads, -1).mean(-1)
        return out


def _detached(value: torch.Tensor | float) -> torch.Tensor | float:
    return value.detach() if isinstance(value, torch.Tensor) else value


class Layer(nn.Module):
    """A pre-norm layer: x + attn(LayerNorm(x)), then x + MLP(LayerNorm(x)), the MLP 4d wide
    with a GELU; attn maps (B, L, d) to (B, L, d)."""

    def __init__(self, d: int, attn: nn.Module):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = attn
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class Model(nn.Module):
    """Token embeddings plus learned position embeddings (drawn with std pos_std), `layers`
    Layers each with an attention from `attention()`, a final LayerNorm where final_norm, and
    a linear head to the vocabulary's logits. Each weight is drawn from torch's generator in
    that order (an attention's projections before its layer's MLP)."""

    def __init__(self, vocab: int, length: int, d: int, layers: int,
                 attention: Callable[[], nn.Module], *, pos_std: float = 0.1,
                 final_norm: bool = False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(length, d) * pos_std)
        self.layers = nn.ModuleList(Layer(d, attention()) for _ in range(layers))
        self.norm = nn.LayerNorm(d) if final_norm else nn.Identity()
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))

    def attentions(self) -> list[nn.Module]:
        return [layer.attn for layer in self.layers]


def attention_params(model: Model) -> dict[str, torch.Tensor]:
    """Each learned attention parameter of a model of Attentions over every layer and head."""
    out: dict[str, list[torch.Tensor]] = {}
    for a in model.attentions():
        for name, value in a.params(model.pos.shape[0]).items():
            out.setdefault(name, []).append(value)
    return {name: torch.cat(values) for name, values in out.items()}


# ---------------------------------------------------------------------------------- probes

def weight_stats(w: torch.Tensor, causal: bool) -> dict[str, float]:
    """What the weights w (B, H, L, L) of one layer do, over the queries that see two keys or
    more: the mean weight on key 0 (`sink`), the shares of visible keys with weight exactly 0
    (`zero`) and below 0 (`negative`), the mean normalized entropy of |w| (in [0, 1], over
    queries with a nonzero weight), the mean and least total (signed) weight per query, and
    the share of queries whose weights are all 0 (`empty`). `uniform_sink` is what uniform
    weights would put on key 0. NaN weights give NaN statistics (nothing is filtered)."""
    length_q, length_k = w.shape[-2:]
    seen = (visible(length_q, length_k, w.device) if causal
            else torch.ones(length_q, length_k, dtype=torch.bool, device=w.device))
    n = seen.sum(-1)
    rows = n >= 2
    w = w.double()[..., rows, :]
    seen, n = seen[rows], n[rows].double()
    total, size = w.sum(-1), w.abs().sum(-1)
    live = size > 0
    p = w.abs() / torch.where(live, size, 1.0).unsqueeze(-1)
    entropy = -torch.xlogy(p, p).sum(-1) / n.log()
    pairs = seen.sum() * w.shape[0] * w.shape[1]
    return {
        "sink": w[..., 0].mean().item(),
        "uniform_sink": (1 / n).mean().item(),
        "zero": (((w == 0) & seen).sum() / pairs).item(),
        "negative": (((w < 0) & seen).sum() / pairs).item(),
        "entropy": entropy[live].mean().item() if live.any() else math.nan,
        "total": total.mean().item(),
        "total_min": total.min().item(),
        "empty": (~live).double().mean().item(),
    }


def role_stats(w: torch.Tensor, roles: torch.Tensor) -> dict[str, list[float]]:
    """Per head of one layer's weights w (B, H, L, L) without a mask, for each role of
    ROLES ((B, L, L) indices): the mean weight per key of that role, w summed over the
    query's keys of the role and divided by their number, averaged over the queries that
    have one (NaN for a role no query has)."""
    out = {}
    w = w.double()
    for r, name in enumerate(ROLES):
        mask = (roles == r).to(w.dtype)[:, None]  # (B, 1, L, L)
        count = mask.sum(-1)
        has = count > 0
        per_key = (w * mask).sum(-1) / count.clamp_min(1)
        mean = (per_key * has).sum((0, 2)) / has.sum((0, 2))
        out[name] = mean.tolist()
    return out


def strongest_head(evaluation: dict) -> tuple[int, int] | None:
    """(layer, head) whose mean weights per key on the three roles differ the most (the
    largest minus the least) in this evaluation: the head that tells the roles apart best,
    whichever way; None without role statistics."""
    roles = evaluation.get("roles")
    if not roles:
        return None
    spreads = []
    for layer in range(len(roles["same"])):
        for head in range(len(roles["same"][layer])):
            values = [roles[name][layer][head] for name in ROLES]
            spread = max(values) - min(values)
            spreads.append((spread if math.isfinite(spread) else -math.inf, layer, head))
    _, layer, head = max(spreads)
    return layer, head


def evaluate(model: Model, x: torch.Tensor, y: torch.Tensor, vocab: int, autocast,
             roles: torch.Tensor | None = None) -> dict:
    """Loss, token accuracy and the attention probes (averaged over layers) on (x, y); the
    gate's mean and share below 0.1 when the model has one; with roles, role_stats per
    layer and head (`roles`: name -> per layer, per head)."""
    model.eval()
    for a in model.attentions():
        a.keep = True
    try:
        with torch.no_grad(), autocast():
            logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1)).item()
            weights = [a.weights() for a in model.attentions()]
            gates = [a.seen_gate.float() for a in model.attentions() if a.seen_gate is not None]
    finally:
        for a in model.attentions():
            a.keep, a.seen, a.seen_gate = False, None, None
        model.train()
    stats = [weight_stats(w, a.causal) for w, a in zip(weights, model.attentions(),
                                                       strict=True)]
    out = {"loss": loss, "acc": (logits.argmax(-1) == y).float().mean().item()}
    for key in stats[0]:
        out[key] = statistics.fmean(s[key] for s in stats)
    out["total_min"] = min(s["total_min"] for s in stats)
    if gates:
        g = torch.cat([t.flatten() for t in gates])
        out["gate"], out["gate_low"] = g.mean().item(), (g < 0.1).float().mean().item()
    if roles is not None:
        per_layer = [role_stats(w, roles) for w in weights]
        out["roles"] = {name: [r[name] for r in per_layer] for name in ROLES}
    return out


# ---------------------------------------------------------------------------------- training

class Config(NamedTuple):
    """One run: a task, an attention function, gated or not, a number of heads."""

    task: str
    kind: str
    gate: bool
    heads: int


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def heads_of(task: str, args: argparse.Namespace) -> list[int]:
    """The head counts `task` runs at: --heads, or the task's default."""
    return args.heads or DEFAULT_HEADS[task]


def build_model(kind: str, task: Task, args: argparse.Namespace, heads: int | None = None,
                gate: bool = False) -> Model:
    torch.manual_seed(args.seed)
    heads = heads or heads_of(task.name, args)[0]
    return Model(task.vocab, task.length, args.d_model, args.layers,
                 lambda: Attention(args.d_model, heads, kind, task.causal, gate)
                 ).to(args.device)


def _param_text(params: dict[str, torch.Tensor]) -> str:
    return "".join(f"  {n} {v.min():.3f}..{v.max():.3f}" for n, v in params.items())


def label(config: Config, args: argparse.Namespace) -> str:
    """How the output names a run: the function, +gate, and the head count and the task
    where the command runs more than one of them."""
    text = config.kind + ("+gate" if config.gate else "")
    if len({h for t in args.task for h in heads_of(t, args)}) > 1:
        text += f" h{config.heads}"
    return text if len(args.task) == 1 else f"{text}/{config.task}"


def train(config: Config, task: Task, steps: int, args: argparse.Namespace) -> dict:
    """Train one configuration on `task` for `steps` steps; the curves and the final probes."""
    kind = config.kind
    model = build_model(kind, task, args, config.heads, config.gate)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # linear: the rate falls to 0 at the last step, so that the last evaluation (what the
    # table reports) is not a constant rate's spike; it also stops what learns late
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, (lambda i: 1 - i / steps) if args.schedule == "linear" else (lambda i: 1.0))
    # fp16's narrow range needs the loss scaled (a no-op when disabled); bf16 does not
    scaler = torch.amp.GradScaler(args.device, enabled=args.dtype == "fp16")

    def autocast():
        return (nullcontext() if args.dtype == "fp32"
                else torch.autocast(args.device, dtype=DTYPES[args.dtype]))

    data = torch.Generator().manual_seed(args.seed)
    ex, ey = task.batch(args.eval_batch, torch.Generator().manual_seed(args.seed + 1), "eval")
    roles = None if task.roles is None else task.roles(ex).to(args.device)
    ex, ey = ex.to(args.device), ey.to(args.device)
    name = label(config, args)
    evals = [{"step": 0, **evaluate(model, ex, ey, task.vocab, autocast, roles),
              "params": {n: v.tolist() for n, v in attention_params(model).items()}}]
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
        sched.step()
        synchronize(args.device)
        if step > args.warmup:
            times.append(time.perf_counter() - start)
            # this process's CPU time (all its threads): what the step costs whatever else
            # the machine runs; on a GPU, only the host's share
            cpu_times.append(time.process_time() - cpu_start)
        losses.append(loss.item())
        if step % args.every == 0 or step == steps:
            params = attention_params(model)
            ev = evaluate(model, ex, ey, task.vocab, autocast, roles)
            evals.append({"step": step, **ev, "params": {n: v.tolist() for n, v in params.items()}})
            ms = f"{1e3 * statistics.median(times):.1f} ms/step" if times else "warming up"
            print(f"{name:9s} step {step:5d}  loss {ev['loss']:.4f}  acc {ev['acc']:6.1%}"
                  f"{_param_text(params)}  {ms}", flush=True)
    return {"attention": kind, "gate": config.gate, "heads": config.heads, "task": task.name,
            "steps": steps, "train_loss": losses,
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

COLUMNS = ["attention", "gate", "heads", "kernel", "eval loss", "eval acc", "ms/step",
           "CPU ms/step", "first-key weight", "zero share", "negative share", "entropy",
           "total weight (mean, min)", "gate mean (share < 0.1)", "learned parameters"]
ROLE_COLUMN = "own / paired / other group, weight per key (layer.head)"


def _param_cell(params: dict[str, list[float]]) -> str:
    return ", ".join(f"{n} {min(v):.3g}..{max(v):.3g}" for n, v in params.items()) or "-"


def rows(runs: list[dict]) -> list[list[str]]:
    """The table's cells for `runs` (one task): the last evaluation of each; on a task with
    roles, the role weights of the head that tells them apart best (strongest_head)."""
    out = []
    for r in runs:
        e = r["evals"][-1]
        gate = (f"{e['gate']:.3f} ({e['gate_low']:.3f})" if "gate" in e else "-")
        row = [r["attention"], "on" if r["gate"] else "off", str(r["heads"]),
               r["implementation"], f"{e['loss']:.3f}", f"{e['acc']:.1%}",
               f"{r['ms_per_step']:.1f}", f"{r['cpu_ms_per_step']:.1f}", f"{e['sink']:.3f}",
               f"{e['zero']:.3f}", f"{e['negative']:.3f}", f"{e['entropy']:.3f}",
               f"{e['total']:.3f}, {e['total_min']:.3f}", gate, _param_cell(e["params"])]
        head = strongest_head(e)
        if head is not None:
            layer, h = head
            row.append(" / ".join(f"{e['roles'][n][layer][h]:.3f}" for n in ROLES)
                       + f" ({layer}.{h})")
        out.append(row)
    return out


def table(runs: list[dict]) -> str:
    """A markdown table per task: the last evaluation of every run."""
    lines = []
    for task in dict.fromkeys(r["task"] for r in runs):
        rs = [r for r in runs if r["task"] == task]
        last = rs[0]["evals"][-1]
        columns = COLUMNS + ([ROLE_COLUMN] if "roles" in last else [])
        lines += [f"**{task}** ({rs[0]['steps']} steps; uniform weights would put "
                  f"{last['uniform_sink']:.3f} on the first key)", "",
                  "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(row) + " |" for row in rows(rs)]
        lines.append("")
    return "\n".join(lines)


def _commit() -> str:
    """The last commit that changed examples/train.py, + "(modified)" when the file differs
    from it."""
    here = Path(__file__).resolve().parent
    name = Path(__file__).name
    try:
        last = subprocess.run(["git", "log", "-1", "--format=%h", "--", name], cwd=here,
                              text=True, capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", name],
                               cwd=here).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit"
    return f"commit {last}" + (" (modified)" if dirty else "") if last else "an unknown commit"


def _machine(doc: dict) -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    device = (torch.cuda.get_device_name() if doc["options"]["device"] == "cuda"
              else "CPU only")
    before, after = doc["load_before"][0], doc["load_after"][0]
    return (f"{model}, {os.cpu_count()} cores, {device}, torch {doc['torch']}, load average "
            f"{before:.1f} before and {after:.1f} after")


def write_results(doc: dict, folder: str) -> None:
    """The results files docs/family_training.md shows: `<task>.json` per task (the table,
    as scripts/docs_tables.py reads it) and `curves.csv` (every evaluation of every run)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    o = doc["options"]
    for task in doc["tasks"]:
        rs = [r for r in doc["runs"] if r["task"] == task["task"]]
        last = rs[0]["evals"][-1]
        columns = COLUMNS + ([ROLE_COLUMN] if "roles" in last else [])
        conditions = (f"{task['about']}; {rs[0]['steps']} steps, d_model {o['d_model']}, "
                      f"{o['layers']} layers, batch {o['batch']}, lr {o['lr']} "
                      f"({o['schedule']}), seed "
                      f"{o['seed']}, {o['dtype']}; uniform weights would put "
                      f"{last['uniform_sink']:.3f} on the first key; examples/train.py at "
                      f"{doc['commit']}, {o['threads']} thread(s) per run, {o['jobs']} "
                      f"run(s) at a time; the wall ms/step follows the load of the moment, "
                      f"compare CPU ms/step")
        table_doc = {"title": f"{task['task']}: the family trained side by side, gated and "
                              "not", "date": doc["date"], "machine": _machine(doc),
                     "command": doc["command"], "conditions": conditions,
                     "columns": columns, "rows": rows(rs)}
        (out / f"{task['task']}.json").write_text(json.dumps(table_doc, indent=1) + "\n")
    keys = ["loss", "acc", "sink", "zero", "negative", "entropy", "total", "total_min",
            "empty", "gate", "gate_low"]
    with open(out / "curves.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["task", "heads", "attention", "gate", "step",
                         *(f"{k}_mean" if k == "gate" else k for k in keys),
                         *(f"{n}_weight" for n in ROLES), "params"])
        for r in doc["runs"]:
            head = strongest_head(r["evals"][-1])
            for e in r["evals"]:
                role = ([e["roles"][n][head[0]][head[1]] for n in ROLES] if head
                        else [""] * len(ROLES))
                writer.writerow([r["task"], r["heads"], r["attention"], int(r["gate"]),
                                 e["step"], *(_cell(e.get(k)) for k in keys),
                                 *(_cell(v) for v in role),
                                 ";".join(f"{n}={statistics.fmean(v):.4g}"
                                          for n, v in e["params"].items())])


def _cell(value: float | str | None) -> str:
    return "" if value is None or value == "" else f"{value:.6g}"


def plot(runs: list[dict], path: str) -> None:
    """Against the step, one line per run (colour: the function; dashed: gated): per task
    and head count two rows of panels, the evaluation loss (with the training loss,
    averaged over 25 steps, faint), accuracy, first-key weight, total weight, the learned
    parameters' means, entropy, zero share, negative share, gate mean; for a task with
    roles, a last row of bars: each run's mean weight per key on the query's own, paired
    and other groups, in the head that tells them apart best (strongest_head), at the end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["task"], r["heads"]) for r in runs))
    role_groups = [g for g in groups
                   if any("roles" in r["evals"][-1] for r in runs if (r["task"], r["heads"]) == g)]
    panels = (("loss", "loss (eval; train faint)"), ("acc", "eval token accuracy"),
              ("sink", "weight on the first key"), ("total", "total weight per query"),
              ("params", "learned parameters (means)"),
              ("entropy", "entropy of |w| / log(keys seen)"),
              ("zero", "share of weights exactly 0"), ("negative", "share of weights < 0"),
              ("gate", "gate mean (gated runs)"), ("empty", "share of queries with no weight"))
    cols = 5
    nrows = 2 * len(groups) + (1 if role_groups else 0)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.3 * nrows), squeeze=False)
    colors = dict(zip(KINDS, plt.get_cmap("tab10").colors, strict=False))
    styles = {"tau": "-", "beta": "--", "eta": "-.", "bias": ":", "gate_bias": (0, (1, 3))}
    for g, (task, heads) in enumerate(groups):
        ax = {key: axes[2 * g + i // cols, i % cols] for i, (key, _) in enumerate(panels)}
        for r in (r for r in runs if (r["task"], r["heads"]) == (task, heads)):
            steps = [e["step"] for e in r["evals"]]
            color, dash = colors[r["attention"]], "--" if r["gate"] else "-"
            name = r["attention"] + ("+gate" if r["gate"] else "")
            for key in ("loss", "acc", "sink", "total", "entropy", "zero", "negative",
                        "empty"):
                ax[key].plot(steps, [e[key] for e in r["evals"]], color=color,
                             linestyle=dash, label=name, linewidth=1)
            if r["gate"]:
                ax["gate"].plot(steps, [e["gate"] for e in r["evals"]], color=color,
                                label=name, linewidth=1)
            train = torch.tensor(r["train_loss"])
            if len(train) >= 25 and not r["gate"]:
                smooth = train.unfold(0, 25, 1).mean(-1)
                ax["loss"].plot(range(25, len(train) + 1), smooth, color=color, alpha=0.3,
                                linewidth=0.8)
            for pname in r["evals"][0]["params"]:
                if pname == "gate_bias" or r["gate"]:
                    continue  # the ungated runs' parameters; the gate's own panel is its mean
                ax["params"].plot(
                    steps, [statistics.fmean(e["params"][pname]) for e in r["evals"]],
                    color=color, linestyle=styles.get(pname, "-"), linewidth=1,
                    label=f"{r['attention']} {pname}")
        uniform = next(r for r in runs if r["task"] == task)["evals"][0]["uniform_sink"]
        ax["sink"].axhline(uniform, color="gray", linestyle=":", linewidth=1)
        ax["sink"].annotate("uniform", (0, uniform), fontsize=7, color="gray")
        for key, title in panels:
            ax[key].set_title(f"{task}, {heads} head(s): {title}", fontsize=9)
            ax[key].set_xlabel("step", fontsize=8)
            ax[key].tick_params(labelsize=7)
        if ax["acc"].lines:
            ax["acc"].legend(fontsize=6, ncol=2)
        if ax["params"].lines:
            ax["params"].legend(fontsize=6)
    for i in range(cols):
        if role_groups and i >= len(role_groups):
            axes[-1, i].axis("off")
    for i, (task, heads) in enumerate(role_groups[:cols]):
        ax = axes[-1, i]
        rs = [r for r in runs if (r["task"], r["heads"]) == (task, heads)]
        width = 0.8 / len(ROLES)
        for j, role in enumerate(ROLES):
            values = []
            for r in rs:
                e = r["evals"][-1]
                layer, h = strongest_head(e)
                values.append(e["roles"][role][layer][h])
            ax.bar([x + (j - 1) * width for x in range(len(rs))], values, width,
                   label=("own group", "paired group", "other groups")[j],
                   color=("tab:green", "tab:red", "tab:gray")[j])
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels([r["attention"] + ("+g" if r["gate"] else "") for r in rs],
                           rotation=60, fontsize=7)
        ax.set_title(f"{task}, {heads} head(s): weight per key by group, at the end\n"
                     "(the head whose three differ the most)", fontsize=9)
        ax.legend(fontsize=7)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
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


def _counts(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct counts of at least 1, "
                                         "comma-separated")
    return counts


DEFAULT_STEPS = {"chars": 1000, "reverse": 600, "signed": 600}
DEFAULT_LENGTH = {"chars": 64, "reverse": 16, "signed": 16}
DEFAULT_HEADS = {"chars": [4], "reverse": [4], "signed": [1, 4]}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--attention", type=_names(KINDS, "functions"), default=["sdpa", "elastic"],
                   help=f"comma-separated, from {','.join(KINDS)} (or all); default sdpa,elastic")
    p.add_argument("--task", type=_names(TASKS, "tasks"), default=["chars"],
                   help=f"comma-separated, from {','.join(TASKS)} (or all); default chars")
    p.add_argument("--gate", choices=tuple(GATES), default="off",
                   help="the gated output: off, on, or both (each function twice)")
    p.add_argument("--steps", type=int,
                   help="training steps (default: chars 1000, reverse 600, signed 600)")
    p.add_argument("--every", type=int, default=50, help="evaluate and print every N steps")
    p.add_argument("--warmup", type=int,
                   help="first steps trained but not timed (default: 10, or half of --steps)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--eval-batch", type=int, default=32)
    p.add_argument("--length", type=int,
                   help="sequence length (default: chars 64, reverse and signed 16)")
    p.add_argument("--vocab", type=int, default=10, help="the reverse task's vocabulary")
    p.add_argument("--groups", type=int, default=8,
                   help="the signed task's groups (even: paired 0-1, 2-3, ...)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=_counts,
                   help="head counts, comma-separated (default: chars and reverse 4, "
                        "signed 1,4)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--schedule", choices=("constant", "linear"), default="constant",
                   help="the learning rate: --lr throughout (constant), or from --lr down to "
                        "0 at the last step (linear)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at a time (processes)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                   help="autocast dtype (fp32: none); parameters stay fp32")
    p.add_argument("--json", help="write every run's curves and probes here")
    p.add_argument("--table", help="write the summary table (markdown) here")
    p.add_argument("--results", help="write <task>.json tables and curves.csv in this folder")
    p.add_argument("--plot", help="write the figure (PNG, needs matplotlib) here")
    p.add_argument("--from-json", metavar="FILE",
                   help="train nothing: write --table, --results and --plot from the --json "
                        "file of an earlier run")
    args = p.parse_args(argv)
    if (args.steps is not None and args.steps < 1) or args.every < 1 or (
            args.warmup is not None and args.warmup < 0):
        p.error("--steps and --every must be at least 1, --warmup at least 0")
    for name in ("batch", "eval_batch", "d_model", "layers", "threads", "jobs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if (args.length is not None and args.length < 2) or args.vocab < 2:
        p.error("--length and --vocab must be at least 2")
    if "signed" in args.task:
        length = args.length or DEFAULT_LENGTH["signed"]
        if args.groups < 2 or args.groups % 2 or args.groups > 2 * length + 1:
            p.error(f"--groups {args.groups}: give an even number from 2 to "
                    f"{2 * length + 1} (2 * length + 1)")
    for heads in sorted({h for t in args.task for h in heads_of(t, args)}):
        if args.d_model % heads:
            p.error(f"--d-model {args.d_model} is not a multiple of --heads {heads}")
    if args.jobs > 1 and args.device == "cuda":
        p.error("--jobs above 1 trains on the CPU only")
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


def configs(args: argparse.Namespace) -> list[Config]:
    """Every run the options ask for, in the order of the output: by task, head count,
    function, then ungated before gated."""
    return [Config(task, kind, gate, heads) for task in args.task
            for heads in heads_of(task, args) for kind in args.attention
            for gate in GATES[args.gate]]


_TASKS: dict[str, Task] = {}


def run_one(config: Config, args: argparse.Namespace) -> dict:
    """Train one configuration (its task built once per process)."""
    if config.task not in _TASKS:
        _TASKS[config.task] = make_task(config.task, args)
    return train(config, _TASKS[config.task], args.steps or DEFAULT_STEPS[config.task], args)


def _in_processes(todo: list[Config], args: argparse.Namespace) -> list[dict]:
    """run_one over todo in args.jobs forked processes, each taking the next configuration
    when it finishes one; the results in todo's order. A run's error stops them all and is
    raised here as a ValueError."""
    ctx = multiprocessing.get_context("fork")
    queue, done = ctx.Queue(), ctx.Queue()
    for i in range(len(todo)):
        queue.put(i)
    for _ in range(args.jobs):
        queue.put(None)

    def work() -> None:  # runs in the forked child: nothing to pickle but the results
        torch.set_num_threads(args.threads)
        while (i := queue.get()) is not None:
            try:
                done.put((i, run_one(todo[i], args), None))
            except Exception as e:  # reported to the parent, which stops the others
                done.put((i, None, f"{type(e).__name__}: {e}"))
                return

    workers = [ctx.Process(target=work, daemon=True) for _ in range(min(args.jobs, len(todo)))]
    for w in workers:
        w.start()
    results: dict[int, dict] = {}
    try:
        while len(results) < len(todo):
            i, result, error = done.get()
            if error is not None:
                raise ValueError(f"{todo[i].kind} on {todo[i].task}: {error}")
            results[i] = result
    finally:
        for w in workers:
            if w.is_alive() and len(results) < len(todo):
                w.terminate()
            w.join()
    return [results[i] for i in range(len(todo))]


def run(args: argparse.Namespace) -> dict:
    """Every configuration in order; the document --json writes."""
    torch.set_num_threads(args.threads)
    todo = configs(args)
    if args.jobs > 1 and any(c.kind != "sdpa" for c in todo):
        # the dispatch loads (or builds) the native kernels here, once, before the clocks
        # start: the forked runs inherit them instead of each loading its own
        choose(torch.empty(1, 1, 2, 8), Weight.SOFTMAX1)
    load = os.getloadavg()
    start, cpu_start = time.perf_counter(), time.process_time()
    children_start = resource.getrusage(resource.RUSAGE_CHILDREN)
    runs = ([run_one(c, args) for c in todo] if args.jobs == 1
            else _in_processes(todo, args))
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu_start + (
        children.ru_utime + children.ru_stime - children_start.ru_utime
        - children_start.ru_stime)
    tasks = []
    for name in args.task:
        task = _TASKS.get(name) or make_task(name, args)
        tasks.append({"task": name, "about": task.about, "length": task.length})
    return {"runs": runs, "tasks": tasks, "options": vars(args), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "seconds": time.perf_counter() - start,
            "cpu_seconds": cpu, "load_before": load, "load_after": os.getloadavg(),
            "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
            "commit": _commit()}


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.from_json:
        try:
            doc = json.loads(Path(args.from_json).read_text())
            runs = doc["runs"]
        except (OSError, ValueError, KeyError) as e:
            print(f"train.py: error: --from-json {args.from_json}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    else:
        try:
            doc = run(args)
        except ValueError as e:  # e.g. a size the task refuses
            print(f"train.py: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        doc["command"] = "python examples/train.py " + shlex.join(
            sys.argv[1:] if argv is None else argv)
        runs = doc["runs"]
    o = doc["options"]
    text = table(runs)
    print(f"\n{text}{doc['seconds']:.0f} s in all ({doc['cpu_seconds']:.0f} s of CPU time), "
          f"{o['threads']} thread(s) per run, {o['jobs']} run(s) at a time, load average "
          f"{doc['load_before'][0]:.2f} before, {doc['load_after'][0]:.2f} after")
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.table:
        Path(args.table).write_text(text)
    if args.results:
        write_results(doc, args.results)
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
