"""Train a small model holding the family's modules under DDP or FSDP2, launched by torchrun.

    torchrun --standalone --nproc-per-node 2 examples/distributed.py --wrapper ddp,fsdp \\
        --steps 30 --json results/distributed.json --checkpoint /tmp/elastic-dcp

The model (docs/distributed.md): token and position embeddings, three pre-norm layers of
multi-head attention and an MLP, a linear head, on the `reverse` task of examples/train.py
(reverse a sequence of random tokens; nothing is downloaded). Its three attentions are the
family's modules: elasticbench.nn.ElasticAttention(param_shape=(H,)) (tau and beta per head),
ElasticSoftmax() over explicitly formed scores (one tau and one beta, stored with shape (1,))
and SymaxAttention(param_shape=(H,)) (eta per head). The `sdpa` model is the same with
torch's scaled_dot_product_attention in all three places; both start from the same weights
(the family's own parameters take nothing from the generator).

Each process takes its share of a global batch drawn from one seed per step, so the global
batch, and with it the gradients, do not depend on the number of processes. For each wrapper
(ddp: DistributedDataParallel; fsdp: FSDP2's fully_shard on each layer and on the model) the
family model and the sdpa model train in lockstep, a step of one then a step of the other, and
the step time reported is the median over the steps after --warmup (the slowest process's),
the wall time of forward, backward and the optimizer's step; beside it the median of the
process's CPU time per step (time.process_time, the slowest process's), which on a CPU shared
with other work counts less of the others' load. The CPU runs gloo, GPUs NCCL (one GPU per
process, --device cuda).

--checkpoint DIR: after the last step each model is saved with torch.distributed.checkpoint
(every process writes its shards; get_state_dict gives the model's and the optimizer's), loaded
into a freshly built and wrapped model and optimizer (set_state_dict), and the two take one
more step on the same batch: the parameters after loading and after that step, and the step's
loss, are compared bit for bit. --json PATH writes the figures (rank 0); --dump PATH writes,
for a test to check, the full gradients of the first step and the full parameters at the
checkpoint (torch.save, rank 0).

A bad option, or a start outside torchrun, is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from elasticbench.nn import ElasticAttention, ElasticSoftmax, SymaxAttention

WRAPPERS = ("ddp", "fsdp")
ATTENTIONS = ("family", "sdpa")


class Config(NamedTuple):
    """The model and the task: vocabulary, sequence length, width, heads, and the batch per
    process (the model has three layers, one per family module)."""

    vocab: int = 16
    length: int = 32
    d: int = 64
    heads: int = 4
    batch: int = 8


DEFAULT = Config()


# ---------------------------------------------------------------------------------- model

class Attention(nn.Module):
    """Multi-head self-attention, without a causal mask (the reverse task sees the whole
    sequence): `kind` is elastic (ElasticAttention, tau and beta per head), scores
    (ElasticSoftmax of q k^T / sqrt(D)), symax (SymaxAttention, eta per head) or sdpa."""

    def __init__(self, d: int, heads: int, kind: str):
        super().__init__()
        self.heads, self.kind = heads, kind
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.inner: nn.Module | None = {
            "elastic": lambda: ElasticAttention(param_shape=(heads,)),
            "scores": lambda: ElasticSoftmax(),
            "symax": lambda: SymaxAttention(param_shape=(heads,)),
            "sdpa": lambda: None,
        }[kind]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.kind == "sdpa":
            o = F.scaled_dot_product_attention(q, k, v)
        elif self.kind == "scores":
            o = self.inner(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5) @ v
        else:
            o = self.inner(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, n, d))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, kind: str):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attention = Attention(d, heads, kind)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    """Embeddings, one layer per attention of `kinds`, a final norm and a linear head: the
    logits of every position, (B * L, vocab)."""

    def __init__(self, cfg: Config, kinds: tuple[str, ...]):
        super().__init__()
        self.embed, self.position = nn.Embedding(cfg.vocab, cfg.d), nn.Embedding(cfg.length, cfg.d)
        self.layers = nn.ModuleList(Layer(cfg.d, cfg.heads, k) for k in kinds)
        self.norm, self.head = nn.LayerNorm(cfg.d), nn.Linear(cfg.d, cfg.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position.weight[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        # (B * L, vocab) from a 2-D product: a fresh tensor, not a view (FSDP2 warns of a
        # root module returning a view, whose in-place use would skip its backward hook)
        return self.head(self.norm(x).reshape(-1, x.shape[-1]))


def build(attention: str, cfg: Config, seed: int) -> Model:
    """The family model (elastic, scores, symax) or the sdpa model, from `seed`: both draw the
    same weights, the family's parameters start at their init (nothing drawn)."""
    torch.manual_seed(seed)
    kinds = ("elastic", "scores", "symax") if attention == "family" else ("sdpa",) * 3
    return Model(cfg, kinds)


def global_batch(cfg: Config, world: int, seed: int, step: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s batch for all processes together (world * cfg.batch sequences), the
    same whatever process draws it; process r takes rows [r * batch, (r + 1) * batch)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randint(0, cfg.vocab, (world * cfg.batch, cfg.length), generator=gen)
    return x, x.flip(1)


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per token: with equal shares per process, the mean over processes
    of their losses (what DDP and FSDP2 average gradients by) is the global batch's."""
    return F.cross_entropy(model(x), y.reshape(-1))


# -------------------------------------------------------------------------- distribution

class Run(NamedTuple):
    rank: int
    world: int
    device: torch.device
    backend: str


def wrap(model: Model, wrapper: str, run: Run) -> nn.Module:
    """DDP, or FSDP2 (fully_shard on each layer, then on the model: each layer's parameters
    are gathered for its forward and backward and freed after, the rest with the root)."""
    model = model.to(run.device)
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        ids = [run.device.index] if run.device.type == "cuda" else None
        # the family's buffers (tau0, beta0, eta0) are constants of the construction, the same
        # in every process, and this model has no other: broadcasting them before each
        # forward (DDP's default) is a collective per step for nothing (docs/distributed.md).
        # torch 2.13 deprecates broadcast_buffers for forward_sync_buffers: the one it has.
        import inspect
        named = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        switch = {"forward_sync_buffers" if named else "broadcast_buffers": False}
        return DistributedDataParallel(model, device_ids=ids, **switch)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(run.device.type, (run.world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def unwrapped(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def full(t: torch.Tensor) -> torch.Tensor:
    """A copy of the whole tensor on the CPU: a DTensor (FSDP2's shards) gathered from every
    process (a collective: every process calls it), a tensor copied (the optimizer's next
    step changes the parameter in place)."""
    from torch.distributed.tensor import DTensor
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: full(p) for n, p in unwrapped(model).named_parameters()}


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: full(p.grad) for n, p in unwrapped(model).named_parameters()}


def optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr)


def step(model: nn.Module, opt: torch.optim.Optimizer, cfg: Config, seed: int, n: int,
         run: Run) -> tuple[float, float, float]:
    """Training step n on this process's share: (the global batch's loss, the wall seconds,
    this process's CPU seconds)."""
    x, y = global_batch(cfg, run.world, seed, n)
    rows = slice(run.rank * cfg.batch, (run.rank + 1) * cfg.batch)
    x, y = x[rows].to(run.device), y[rows].to(run.device)
    sync(run)
    start, start_cpu = time.perf_counter(), time.process_time()
    opt.zero_grad(set_to_none=True)
    loss = loss_of(model, x, y)
    loss.backward()
    opt.step()
    sync(run)
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / run.world, seconds, cpu


def sync(run: Run) -> None:
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)


def slowest(values: list[float], run: Run) -> list[float]:
    """The largest of the processes' values, one by one."""
    t = torch.tensor(values, dtype=torch.float64, device=run.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def checkpoint(model: nn.Module, opt: torch.optim.Optimizer, wrapper: str, attention: str,
               args: argparse.Namespace, cfg: Config, run: Run, directory: Path,
               dump: dict | None) -> dict:
    """Save model and optimizer with torch.distributed.checkpoint, load them into a fresh
    wrapped model and optimizer, take step args.steps on both: the verdicts, bit for bit."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))
    saved = full_parameters(model)
    if run.rank == 0 and dump is not None:
        dump[f"{wrapper}/{attention}/checkpoint"] = str(directory)
        dump[f"{wrapper}/{attention}/parameters"] = saved

    fresh = wrap(build(attention, cfg, args.seed + 1), wrapper, run)  # other weights
    fresh_opt = optimizer(fresh, args.lr)
    model_sd, optim_sd = get_state_dict(fresh, fresh_opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    loaded = full_parameters(fresh)
    same_loaded = all(torch.equal(saved[n], loaded[n]) for n in saved)
    loss_a = step(model, opt, cfg, args.seed, args.steps, run)[0]
    loss_b = step(fresh, fresh_opt, cfg, args.seed, args.steps, run)[0]
    after_a, after_b = full_parameters(model), full_parameters(fresh)
    return {"directory": str(directory), "parameters_identical": same_loaded,
            "next_loss": [loss_a, loss_b], "next_loss_identical": loss_a == loss_b,
            "next_step_parameters_identical": all(torch.equal(after_a[n], after_b[n])
                                                  for n in after_a)}


def train(wrapper: str, args: argparse.Namespace, cfg: Config, run: Run, dump: dict | None) -> dict:
    """Both models under `wrapper`, in lockstep; their losses, step times, ratio and (with
    --checkpoint) the checkpoint's verdicts."""
    models = {a: wrap(build(a, cfg, args.seed), wrapper, run) for a in ATTENTIONS}
    opts = {a: optimizer(m, args.lr) for a, m in models.items()}
    losses: dict[str, list[float]] = {a: [] for a in ATTENTIONS}
    times: dict[str, list[float]] = {a: [] for a in ATTENTIONS}
    cpu_times: dict[str, list[float]] = {a: [] for a in ATTENTIONS}
    for n in range(args.steps):
        for a in ATTENTIONS:
            loss, seconds, cpu = step(models[a], opts[a], cfg, args.seed, n, run)
            losses[a].append(loss)
            wall, cpu = slowest([seconds, cpu], run)
            times[a].append(wall)
            cpu_times[a].append(cpu)
            if n == 0 and dump is not None:
                grads = full_gradients(models[a])
                if run.rank == 0:
                    dump[f"{wrapper}/{a}/gradients"] = grads
    out: dict = {}
    for a in ATTENTIONS:
        kept = times[a][args.warmup:] or times[a]
        kept_cpu = cpu_times[a][args.warmup:] or cpu_times[a]
        out[a] = {"step_ms": 1e3 * statistics.median(kept),
                  "step_cpu_ms": 1e3 * statistics.median(kept_cpu), "losses": losses[a],
                  "steps_timed": len(kept)}
    out["ratio_family_over_sdpa"] = out["family"]["step_ms"] / out["sdpa"]["step_ms"]
    out["cpu_ratio_family_over_sdpa"] = (out["family"]["step_cpu_ms"]
                                         / out["sdpa"]["step_cpu_ms"])
    out["learned_log_scales"] = learned(models["family"])
    if args.checkpoint:
        out["checkpoint"] = {a: checkpoint(models[a], opts[a], wrapper, a, args, cfg, run,
                                           Path(args.checkpoint) / f"{wrapper}-{a}", dump)
                             for a in ATTENTIONS}
    return out


def learned(model: nn.Module) -> dict[str, list[float]]:
    """The family's learned parameters after training (tau, beta, eta), for the report."""
    m = unwrapped(model)
    return {n: full(p).reshape(-1).tolist() for n, p in m.named_parameters()
            if n.rsplit(".", 1)[-1] in ("log_tau_scale", "log_beta_scale", "log_eta_scale")}


def machine(device: torch.device) -> str:
    """The machine in words: the GPU's name, or the CPU's model and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")]
        name = models[0] if models else name
    return f"a {os.cpu_count()}-core {name} CPU"


def table(report: dict, argv: list[str] | None) -> dict:
    """The fields scripts/docs_tables.py renders (title, date, machine, command, conditions,
    columns, rows): one row per wrapper."""
    cfg = report["config"]
    rows = []
    for wrapper, r in report["runs"].items():
        checked = r.get("checkpoint")
        same = ("not run" if checked is None else
                "identical" if all(c["parameters_identical"] and c["next_loss_identical"]
                                   and c["next_step_parameters_identical"]
                                   for c in checked.values()) else "differs")
        rows.append([wrapper, f"{r['family']['step_ms']:.1f}", f"{r['sdpa']['step_ms']:.1f}",
                     f"{r['ratio_family_over_sdpa']:.2f}x",
                     f"{r['cpu_ratio_family_over_sdpa']:.2f}x", same])
    args = " ".join(sys.argv[1:] if argv is None else argv)
    timed = next(iter(report["runs"].values()))["family"]["steps_timed"]
    return {
        "title": "The family's model against the same model with SDPA, under DDP and FSDP2",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": (f"torchrun --standalone --nproc-per-node {report['world_size']} "
                    f"examples/distributed.py {args}").strip(),
        "conditions": (f"{report['world_size']} processes ({report['backend']}), "
                       f"{report['threads_per_process']} thread each, torch {report['torch']}; "
                       f"d={cfg['d']}, {cfg['heads']} heads, length {cfg['length']}, "
                       f"{cfg['batch']} sequences per process; the median of "
                       f"{timed} steps after {report['steps'] - timed}, the slowest process's"
                       + (f"; load average {os.getloadavg()[0]:.1f} at the end (work of others "
                          "on the machine counts in the wall times)"
                          if hasattr(os, "getloadavg") else "")),
        "columns": ["wrapper", "family ms/step", "sdpa ms/step", "ratio (wall)",
                    "ratio (CPU time)", "DCP checkpoint round trip"],
        "rows": rows,
    }


# ------------------------------------------------------------------------------- the CLI

class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _wrappers(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not names or any(n not in WRAPPERS for n in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct wrappers from "
                                         f"{', '.join(WRAPPERS)}")
    return names


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--wrapper", type=_wrappers, default=list(WRAPPERS),
                   help="comma-separated, from ddp,fsdp; default both")
    p.add_argument("--steps", type=_positive, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the step time")
    p.add_argument("--batch", type=_positive, default=DEFAULT.batch, help="sequences per process")
    p.add_argument("--length", type=_positive, default=DEFAULT.length)
    p.add_argument("--vocab", type=_positive, default=DEFAULT.vocab)
    p.add_argument("--d-model", type=_positive, default=DEFAULT.d)
    p.add_argument("--heads", type=_positive, default=DEFAULT.heads)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_positive, default=1, help="torch threads per process")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--checkpoint", help="save, load and compare a DCP checkpoint under DIR")
    p.add_argument("--json", help="write the figures here (rank 0)")
    p.add_argument("--dump", help="write first-step gradients and checkpointed parameters here")
    args = p.parse_args(argv)
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if args.warmup < 0:
        p.error("--warmup must be at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        p.error("start it with torchrun, e.g. torchrun --standalone --nproc-per-node 2 "
                "examples/distributed.py")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    run = Run(dist.get_rank(), dist.get_world_size(), device, backend)
    cfg = Config(args.vocab, args.length, args.d_model, args.heads, args.batch)
    dump: dict = {"config": cfg._asdict(), "seed": args.seed, "world": run.world}
    report: dict = {"world_size": run.world, "backend": backend, "device": device.type,
                    "threads_per_process": args.threads, "torch": torch.__version__,
                    "machine": machine(device),
                    "config": cfg._asdict(), "steps": args.steps, "warmup": args.warmup,
                    "runs": {}}
    try:
        for wrapper in args.wrapper:
            result = train(wrapper, args, cfg, run, dump if args.dump else None)
            report["runs"][wrapper] = result
            if run.rank == 0:
                fam, ref = result["family"], result["sdpa"]
                line = (f"{wrapper:5s} family {fam['step_ms']:.2f} ms/step  sdpa "
                        f"{ref['step_ms']:.2f} ms/step  ratio "
                        f"{result['ratio_family_over_sdpa']:.3f} (CPU time "
                        f"{result['cpu_ratio_family_over_sdpa']:.3f})  loss family "
                        f"{fam['losses'][-1]:.4f} sdpa {ref['losses'][-1]:.4f}")
                if "checkpoint" in result:
                    ok = all(c["parameters_identical"] and c["next_loss_identical"]
                             and c["next_step_parameters_identical"]
                             for c in result["checkpoint"].values())
                    line += f"  checkpoint {'identical' if ok else 'DIFFERS'}"
                print(line, flush=True)
        if run.rank == 0:
            if args.json:
                report.update(table(report, argv))
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
            if args.dump:
                torch.save(dump, args.dump)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
