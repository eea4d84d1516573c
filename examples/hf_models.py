"""Train Hugging Face transformers models with each attention function of the family.

    python examples/hf_models.py                          # llama,gpt2 x sdpa + the family
    python examples/hf_models.py --model llama --attention sdpa,elastic --steps 100
    python examples/hf_models.py --json results/family_training_hf.json \\
        --table results/family_training_hf.md --doc docs/transformers.md
    python examples/hf_models.py --from-json results/family_training_hf.json --doc docs/transformers.md

Two small models are built from transformers configs (nothing is downloaded): a Llama-style
one (LlamaConfig: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention with
--kv-heads key heads) and a GPT-2-style one (GPT2Config: LayerNorm, learned positions, GELU
MLP, tied embeddings; dropout off). Each is trained on the character task of
examples/train.py (its data: the source of a few standard-library modules, the last tenth
held out; the same batches in the same order for every run) with transformers' `sdpa` and
with each function of the family through elasticbench.integrations.transformers
(use_family: per-head parameters on every attention layer). For every model the weights start
from the same seed (the family's parameters draw nothing from the generator).

After training, each run decodes greedily twice from the same prompts: `model.generate` with
its key-value cache, and the full forward recomputed over the whole sequence at each step.
The table gives whether the tokens agree and the largest difference between the two logits
(the cached decode runs the fused kernels on one query against the cache; the recompute runs
them causally over the whole sequence).

--json writes every run (curves, timings, decode check); --table the markdown table;
--plot the evaluation loss curves (matplotlib);
--doc rewrites the table between the markers `<!-- hf-table:begin -->` and
`<!-- hf-table:end -->` of a markdown file (docs/transformers.md); --from-json renders a
saved --json without training. A bad option is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

EXAMPLES = Path(__file__).resolve().parent
MODELS = ("llama", "gpt2")
KINDS = ("sdpa", "elastic", "softmax1", "symax", "stablemax", "sigmoid")
BEGIN, END = "<!-- hf-table:begin -->", "<!-- hf-table:end -->"


@functools.cache
def _train_example():
    """examples/train.py as a module: its character task (the data, not its model)."""
    spec = importlib.util.spec_from_file_location("elasticbench_train_example",
                                                  EXAMPLES / "train.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # dataclasses and NamedTuples look their module up
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------- models


def build(model: str, args: argparse.Namespace, vocab: int):
    """The transformers model `model` from a config at the sizes of args, seeded."""
    import transformers

    torch.manual_seed(args.seed)
    common = {"vocab_size": vocab, "bos_token_id": None, "eos_token_id": None,
              "pad_token_id": None}
    if model == "llama":
        config = transformers.LlamaConfig(
            hidden_size=args.d_model, intermediate_size=4 * args.d_model,
            num_hidden_layers=args.layers, num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads, max_position_embeddings=args.length,
            attention_dropout=0.0, tie_word_embeddings=False, **common)
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(
        n_embd=args.d_model, n_layer=args.layers, n_head=args.heads, n_positions=args.length,
        n_inner=4 * args.d_model, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, **common)
    return transformers.GPT2LMHeadModel(config)


def switch(net, kind: str) -> None:
    """sdpa (transformers' own) or one of the family through the integration."""
    if kind == "sdpa":
        net.set_attn_implementation("sdpa")
        return
    from elasticbench.integrations.transformers import use_family

    use_family(net, kind)


def learned(net) -> dict[str, list[float]]:
    """Each learned attention parameter, one value per head, over every layer."""
    from elasticbench.integrations.transformers import PARAM_ATTR, attention_layers

    out: dict[str, list[float]] = {}
    for _, layer in attention_layers(net):
        held = getattr(layer, PARAM_ATTR, None)
        if held is None:
            continue
        if hasattr(held, "params"):
            values = dict(zip(("tau", "beta"), held.params(), strict=True))
        elif hasattr(held, "eta"):
            values = {"eta": held.eta}
        else:
            values = {"bias": held.bias(net.config.max_position_embeddings)}
        for name, v in values.items():
            out.setdefault(name, []).extend(v.detach().float().flatten().tolist())
    return out


def kernel(net, kind: str, dtype: torch.dtype = torch.float32) -> str:
    """What computes the attention: torch's SDPA, or the implementation elasticbench's
    dispatch picks for a query of the model's shape (native C++, Triton, torch)."""
    if kind == "sdpa":
        return "torch sdpa"
    from elasticbench.attention.autograd import choose
    from elasticbench.attention.weights import Weight

    q = torch.empty(1, 1, 2, 8, dtype=dtype, device=net.device)
    return choose(q, Weight[kind.upper()]).name


# ---------------------------------------------------------------------------------- runs


def evaluate(net, x: torch.Tensor, y: torch.Tensor, vocab: int) -> dict[str, float]:
    net.eval()
    with torch.no_grad():
        logits = net(x).logits
    net.train()
    loss = F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1)).item()
    return {"loss": loss, "acc": (logits.argmax(-1) == y).float().mean().item()}


def decode_check(net, prompt: torch.Tensor, tokens: int) -> dict:
    """Greedy decoding with the cache (generate) against the full forward recomputed at
    each step: whether the tokens agree, and the largest logit difference."""
    net.eval()
    ones = torch.ones_like(prompt)
    with torch.no_grad():
        out = net.generate(prompt, attention_mask=ones, max_new_tokens=tokens,
                           do_sample=False, use_cache=True, output_logits=True,
                           return_dict_in_generate=True, pad_token_id=0)
        seq, diffs, scale = prompt, [], 0.0
        for step in range(tokens):
            logits = net(seq, attention_mask=torch.ones_like(seq)).logits[:, -1]
            diffs.append((logits - out.logits[step]).abs().max().item())
            scale = max(scale, logits.abs().max().item())
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    net.train()
    cached = out.sequences[:, prompt.shape[1]:]
    return {"tokens_equal": bool(torch.equal(cached, seq[:, prompt.shape[1]:])),
            "max_logit_diff": max(diffs), "max_abs_logit": scale,
            "cached_tokens": cached.tolist(), "prompt_length": prompt.shape[1]}


def train(model: str, kind: str, task, args: argparse.Namespace) -> dict:
    """Train `model` with attention `kind` for args.steps steps: curves, timings, check."""
    net = build(model, args, task.vocab)
    switch(net, kind)
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(args.seed)
    ex, ey = task.batch(args.eval_batch, torch.Generator().manual_seed(args.seed + 1), "eval")
    evals = [{"step": 0, **evaluate(net, ex, ey, task.vocab), "params": learned(net)}]
    losses, times, cpu_times = [], [], []
    for step in range(1, args.steps + 1):
        x, y = task.batch(args.batch, data, "train")
        start, cpu_start = time.perf_counter(), time.process_time()
        logits = net(x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, task.vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step > args.warmup:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        losses.append(loss.item())
        if step % args.every == 0 or step == args.steps:
            ev = evaluate(net, ex, ey, task.vocab)
            evals.append({"step": step, **ev, "params": learned(net)})
            ms = f"{1e3 * statistics.median(times):.1f} ms/step" if times else "warming up"
            print(f"{model:5s} {kind:9s} step {step:4d}  loss {ev['loss']:.4f}  "
                  f"acc {ev['acc']:6.1%}  {ms}", flush=True)
    check = decode_check(net, ex[:2, : args.prompt], args.gen_tokens)
    return {"model": model, "attention": kind, "steps": args.steps, "train_loss": losses,
            "ms_per_step": 1e3 * statistics.median(times),
            "cpu_ms_per_step": 1e3 * statistics.median(cpu_times), "timed_steps": len(times),
            "evals": evals, "decode": check, "kernel": kernel(net, kind),
            "model_parameters": sum(p.numel() for p in net.parameters())}


# ---------------------------------------------------------------------------------- report


def table(doc: dict) -> str:
    """A markdown table per model from a --json document: the last evaluation and the
    decode check of every run."""
    lines = []
    runs = doc["runs"]
    for model in dict.fromkeys(r["model"] for r in runs):
        rs = [r for r in runs if r["model"] == model]
        lines += [f"**{model}** ({rs[0]['model_parameters']} parameters with sdpa, "
                  f"{rs[0]['steps']} steps)", "",
                  "| attention | kernel | eval loss (step 0 -> last) | eval acc | ms/step | "
                  "CPU ms/step | cached decode == recompute | max logit diff (u) | "
                  "learned parameters |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            first, last, dec = r["evals"][0], r["evals"][-1], r["decode"]
            params = ", ".join(f"{n} {min(v):.3g}..{max(v):.3g}"
                               for n, v in last["params"].items())
            lines.append(
                f"| {r['attention']} | {r['kernel']} | {first['loss']:.3f} -> {last['loss']:.3f}"
                f" | {last['acc']:.1%} | {r['ms_per_step']:.1f} | {r['cpu_ms_per_step']:.1f} | "
                f"{'yes' if dec['tokens_equal'] else 'NO'} ({len(dec['cached_tokens'][0])} "
                f"tokens) | {dec['max_logit_diff']:.2g} ({_units(dec):.1f}) | {params or '-'} |")
        lines.append("")
    o = doc["options"]
    lines.append("u: fp32's machine epsilon times the largest |logit| of the recomputed "
                 "steps (the logits' unit of rounding).")
    lines.append("")
    lines.append(f"Character task, length {o['length']}, batch {o['batch']}, d_model "
                 f"{o['d_model']}, {o['layers']} layers, {o['heads']} heads (Llama: "
                 f"{o['kv_heads']} key heads), AdamW lr {o['lr']}, seed {o['seed']}; "
                 f"{doc['machine']}, {doc['threads']} thread(s); torch {doc['torch']}, "
                 f"transformers {doc['transformers']}; commit {doc.get('commit') or '?'}; "
                 f"{doc['seconds']:.0f} s in all.")
    return "\n".join(lines) + "\n"


def _units(decode: dict) -> float:
    """A decode check's largest logit difference in units of fp32's epsilon times the
    largest |logit|."""
    return decode["max_logit_diff"] / (torch.finfo(torch.float32).eps
                                       * max(decode["max_abs_logit"], 1e-30))


def plot(doc: dict, path: str) -> None:
    """The evaluation loss against the step, one panel per model, one line per attention
    (the training loss averaged over 25 steps, faint)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in doc["runs"]))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    colors = dict(zip(KINDS, plt.get_cmap("tab10").colors, strict=False))
    for ax, model in zip(axes[0], models, strict=True):
        for r in (r for r in doc["runs"] if r["model"] == model):
            color = colors[r["attention"]]
            ax.plot([e["step"] for e in r["evals"]], [e["loss"] for e in r["evals"]],
                    color=color, marker="o", label=r["attention"])
            train = torch.tensor(r["train_loss"])
            if len(train) >= 25:
                ax.plot(range(25, len(train) + 1), train.unfold(0, 25, 1).mean(-1),
                        color=color, alpha=0.3, linewidth=0.8)
        ax.set_title(f"{model}: eval loss (train, 25-step mean, faint)", fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_doc(path: str, text: str) -> None:
    """Replace what lies between BEGIN and END in the markdown file at path by text."""
    doc = Path(path).read_text(encoding="utf-8")
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise ValueError(f"{path} needs one {BEGIN} line before one {END} line")
    head, rest = doc.split(BEGIN)
    _, tail = rest.split(END)
    Path(path).write_text(f"{head}{BEGIN}\n{text}{END}{tail}", encoding="utf-8")


# ---------------------------------------------------------------------------------- command


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    example = _train_example()  # its parser: one line and exit status 2 on bad options
    p = example.Parser(prog="hf_models.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=example._names(MODELS, "models"), default=list(MODELS),
                   help="comma-separated, from llama,gpt2 (or all); default both")
    p.add_argument("--attention", type=example._names(KINDS, "functions"), default=list(KINDS),
                   help=f"comma-separated, from {','.join(KINDS)} (or all); default all")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=50, help="evaluate and print every N steps")
    p.add_argument("--warmup", type=int, default=10, help="first steps trained, not timed")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--eval-batch", type=int, default=32)
    p.add_argument("--length", type=int, default=64, help="sequence length (the context)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2, help="Llama's key-value heads (GQA)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt", type=int, default=16, help="decode check: prompt length")
    p.add_argument("--gen-tokens", type=int, default=16, help="decode check: new tokens")
    p.add_argument("--json", help="write every run here")
    p.add_argument("--table", help="write the markdown table here")
    p.add_argument("--plot", help="write the loss curves (PNG, needs matplotlib) here")
    p.add_argument("--doc", help="rewrite the table between the hf-table markers of this file")
    p.add_argument("--from-json", help="render this --json file instead of training")
    args = p.parse_args(argv)
    for name in ("steps", "every", "batch", "eval_batch", "d_model", "heads", "kv_heads",
                 "layers", "threads", "prompt", "gen_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or args.warmup >= args.steps:
        p.error(f"--warmup must be at least 0 and below --steps ({args.steps})")
    if args.length < 2 or args.prompt + args.gen_tokens > args.length:
        p.error(f"--length must be at least 2 and hold --prompt + --gen-tokens "
                f"({args.prompt + args.gen_tokens})")
    if args.d_model % args.heads or args.heads % args.kv_heads:
        p.error("--d-model must be a multiple of --heads, and --heads of --kv-heads")
    if args.from_json and not Path(args.from_json).is_file():
        p.error(f"--from-json {args.from_json}: no such file")
    if args.doc and not Path(args.doc).is_file():
        p.error(f"--doc {args.doc}: no such file")
    try:
        import transformers  # noqa: F401
    except ImportError:
        p.error("needs transformers (pip install elasticbench[transformers])")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib (pip install elasticbench[plot])")
    return args


def run(args: argparse.Namespace) -> dict:
    """Every (model, attention) pair in order; the document --json writes."""
    import transformers

    torch.set_num_threads(args.threads)
    commit = _commit()  # before the runs: the code they load is this checkout's now
    task = _train_example().chars_task(args.length)
    start, cpu_start = time.perf_counter(), time.process_time()
    runs = [train(model, kind, task, args) for model in args.model for kind in args.attention]
    return {"runs": runs, "task": task.about, "options": vars(args), "commit": commit,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores",
            "threads": torch.get_num_threads(), "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu_start}


def _commit() -> str | None:
    """The checkout's commit (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=EXAMPLES,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    try:
        if args.from_json:
            doc = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        else:
            doc = run(args)
        text = table(doc)
        if args.doc:
            write_doc(args.doc, text)
    except (ValueError, KeyError) as e:
        print(f"hf_models.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"\n{text}")
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.table:
        Path(args.table).write_text(text)
    if args.plot:
        plot(doc, args.plot)


if __name__ == "__main__":
    main()
