"""Train a tiny transformer on a toy task with SDPA and with Elastic attention, side by side.

The task: reverse a sequence of tokens. The model: token and position embeddings, two
pre-norm layers of multi-head attention and an MLP, a linear head. The same model, seed and
batches run with torch's scaled_dot_product_attention and with ElasticAttention (per-head
learnable tau and beta); every `--every` steps each prints its loss, token accuracy, the
range of tau and beta over the heads (Elastic) and milliseconds per step.

    python examples/train.py --steps 600
    python examples/train.py --device cuda --dtype bf16

--device cuda trains on the GPU (the batches are still drawn on the CPU, so both devices see
the same data); --dtype bf16 or fp16 runs the forward under torch.autocast in that dtype with
the parameters kept in fp32, fp16 with a GradScaler. A bad option, or cuda where none is
available, is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from elasticbench.nn import ElasticAttention


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, kind: str):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.elastic = ElasticAttention(param_shape=(heads,)) if kind == "elastic" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        q, k, v = (t.view(b, length, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, -1))
        o = self.elastic(q, k, v) if self.elastic else F.scaled_dot_product_attention(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, length, d))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, kind: str):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, kind)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class Model(nn.Module):
    def __init__(self, vocab: int, length: int, d: int, heads: int, layers: int, kind: str):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(length, d) * 0.1)
        self.layers = nn.ModuleList(Layer(d, heads, kind) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    def tau_beta(self) -> str:
        ts = [m.elastic for m in self.modules() if isinstance(m, Attention) and m.elastic]
        if not ts:
            return ""
        tau = torch.cat([m.tau.detach().flatten() for m in ts])
        beta = torch.cat([m.beta.detach().flatten() for m in ts])
        return (f"  tau {tau.min():.3f}..{tau.max():.3f}"
                f"  beta {beta.min():.3f}..{beta.max():.3f}")


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train(kind: str, args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    model = Model(args.vocab, args.length, args.d_model, args.heads, args.layers, kind)
    model.to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # fp16's narrow range needs the loss scaled (a no-op when disabled); bf16 does not
    scaler = torch.amp.GradScaler(args.device, enabled=args.dtype == "fp16")
    data = torch.Generator().manual_seed(args.seed)
    spent = 0.0
    for step in range(1, args.steps + 1):
        x = torch.randint(0, args.vocab, (args.batch, args.length), generator=data)
        target = x.flip(1)
        x, target = x.to(args.device), target.to(args.device)
        synchronize(args.device)
        start = time.perf_counter()
        with (nullcontext() if args.dtype == "fp32"
              else torch.autocast(args.device, dtype=DTYPES[args.dtype])):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), target.reshape(-1))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        synchronize(args.device)
        spent += time.perf_counter() - start
        if step % args.every == 0 or step == args.steps:
            acc = (logits.argmax(-1) == target).float().mean().item()
            print(f"{kind:7s} step {step:5d}  loss {loss.item():.4f}  acc {acc:6.1%}"
                  f"{model.tau_beta()}  {1e3 * spent / step:.1f} ms/step", flush=True)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def main() -> None:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--every", type=int, default=50, help="print every N steps")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=16)
    p.add_argument("--vocab", type=int, default=10)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", choices=("sdpa", "elastic"), help="train one of the two")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                   help="autocast dtype (fp32: none); parameters stay fp32")
    args = p.parse_args()
    if args.steps < 1 or args.every < 1:
        p.error("--steps and --every must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda: no CUDA device is available here (torch {torch.__version__})")
    torch.set_num_threads(args.threads)
    for kind in (args.only,) if args.only else ("sdpa", "elastic"):
        train(kind, args)


if __name__ == "__main__":
    main()
