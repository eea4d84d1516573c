"""Every figure of the library's user path on one device, in one run (about 4 minutes on an H100).

    python3 scripts/gpu_user_path.py [--device cuda|cpu] [--quick] [--json PATH]
                                     [--only sync,graph,compile,rows,attention] [--budget S]
                                     [--dtype bf16|fp32]

The model of sync, graph and compile is in --dtype (bf16 by default: its parameters, inputs
and so every kernel it calls, so that the attention configuration table's path is what runs
and what a graph captures, not fp32's single configuration); each of these sections records
the launches the library noted while it ran (elasticbench.launches: the row plans and the
attention configurations), so the JSON says which configurations the step launched.

Sections (each runs on its own: one that fails records a one-line reason and the others run):

  sync       a training step (forward, backward, AdamW step) of a small model holding
             ElasticSoftmax(param_shape=(H, 1, 1)) over attention scores and
             ElasticAttention(param_shape=(H,), causal=True) with a (B, 1, 1, L) bool
             key-padding mask, under torch.cuda.set_sync_debug_mode("error"), after one
             warm-up step (whose sync warnings are counted). CUDA only (on the CPU the
             warm-up step runs eagerly, for its launches, and the section says skipped).
  graph      the same model's whole training step (AdamW with capturable=True) captured in a
             torch.cuda.CUDAGraph after a warm-up on a side stream, replayed three times, and
             compared with three eager steps of a copy from the same state (model and
             optimizer): passed when every loss agrees within 1e-6 relative (the same
             kernels on the same values: the same bits). CUDA only.
  compile    torch.compile(model, fullgraph=True) forward and backward (fullgraph raises on a
             graph break), its loss and gradients against eager ones, and the graph-break
             count of torch._dynamo.explain.
  rows       Elastic-Softmax rows, 4096 x 4096 (quick: 64 x 256), fp32 and bf16, forward,
             backward and both: torch.softmax; the raw Triton kernels (elastic_forward,
             elastic_backward, float tau and beta); the public elastic_softmax(x, tau, beta);
             the module ElasticSoftmax() (learnable tensors). Ratios public/raw, module/raw,
             public/torch.softmax.
  attention  bf16, B=4, H=16, D=128, L=2048 and 8192 (8192 unless the budget is short; quick:
             B=1, H=2, L=64, D=16), causal and not: the public elastic_attention, the module
             ElasticAttention(param_shape=(H,)), the Triton kernels called directly
             (attention_forward, attention_backward with (B, H) fp32 tau and beta) and SDPA;
             ratios public/direct, module/direct, public/SDPA, and TFLOP/s (forward
             4 B H L^2 D, backward 2.5 times that, both halved when causal).

Timing: on CUDA triton.testing.do_bench (the median, with its L2 flush); on the CPU, and
with --quick anywhere, the median of a perf_counter loop (synchronized on CUDA). "fwd" is
the forward with nothing needing a gradient for the public API, torch.softmax, SDPA and the
raw kernels, and with the module's parameters needing one for the modules; "bwd" is the
backward alone (autograd.grad of a kept graph, retain_graph=True; the raw kernels' own
backward); "fwd+bwd" both. On the CPU the raw Triton kernels run only under TRITON_INTERPRET=1
(else they are skipped with the reason), and the public API runs whatever
elasticbench.dispatch picks (the native C++ kernels, where they build); the JSON says which.

--json PATH is rewritten after every measurement, so a run cut off keeps what it measured;
it holds the device, torch and Triton versions, the commit, and every section. The exit
status is 1 when a section failed, else 0.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from elasticbench import launches
from elasticbench.functional import elastic_attention, elastic_softmax
from elasticbench.harness.environment import cpu_model
from elasticbench.nn import ElasticAttention, ElasticSoftmax

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("sync", "graph", "compile", "rows", "attention")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TAU, BETA = 1.0, 1.0  # the float parameters of the public calls and the raw kernels
PASSES = ("fwd", "bwd", "fwd+bwd")
REL_TOL = 1e-6  # graph: replayed against eager losses, fp32


# ---------------------------------------------------------------------------------------
# Small helpers


def one_line(e: BaseException) -> str:
    """The exception's type and the first nonblank line of its message, at most 240 chars."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def where(e: BaseException) -> str | None:
    """file:line of the innermost frame of the traceback inside this repository (the
    library's or its kernels' code), else the innermost frame; None without a traceback."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return None
    ours = [f for f in frames if str(ROOT) in f.filename and "/scripts/" not in f.filename]
    f = (ours or frames)[-1]
    name = os.path.relpath(f.filename, ROOT) if str(ROOT) in f.filename else f.filename
    return f"{name}:{f.lineno} ({f.name})"


def rel_diff(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return (f"{cpu_model()} ({os.cpu_count()} cores, torch uses {torch.get_num_threads()} "
            "threads)")


def commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=ROOT, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def triton_version() -> str | None:
    try:
        import triton
    except Exception:
        return None
    return triton.__version__


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def fmt(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}"


# ---------------------------------------------------------------------------------------
# The run: options, the JSON, the deadline


class Run:
    """The options, the JSON document (rewritten on every save) and the time budget."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.device, self.quick = args, args.device, args.quick
        self.start = time.monotonic()
        self.doc: dict[str, Any] = {
            "script": "scripts/gpu_user_path.py",
            "device": device_name(args.device),
            "device_type": args.device,
            "torch": torch.__version__,
            "triton": triton_version(),
            "commit": commit(),
            "python": platform.python_version(),
            "quick": args.quick,
            "timer": self.timer_name(),
            "environment": {k: os.environ.get(k) for k in
                            ("ELASTICBENCH_IMPLEMENTATION", "TRITON_INTERPRET")},
            "budget_s": args.budget,
            "model_dtype": args.dtype,
            "sections": {},
        }
        if args.device == "cuda":
            props = torch.cuda.get_device_properties(0)
            self.doc["sms"] = props.multi_processor_count
        self.save()

    def timer_name(self) -> str:
        if self.device == "cuda" and not self.quick:
            return "triton.testing.do_bench median (L2 flushed), ms"
        return "perf_counter median of single calls, ms" + (
            " (synchronized)" if self.device == "cuda" else "")

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.start)

    def save(self) -> None:
        self.doc["elapsed_s"] = round(time.monotonic() - self.start, 2)
        if not self.args.json:
            return
        tmp = f"{self.args.json}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1, allow_nan=True)
        os.replace(tmp, self.args.json)

    def time(self, fn: Callable[[], Any]) -> float:
        """ms per call of fn: do_bench's median on CUDA (not --quick), else the median of a
        perf_counter loop of single calls."""
        if self.device == "cuda" and not self.quick:
            from triton.testing import do_bench

            return float(do_bench(fn, return_mode="median"))
        for _ in range(2):
            fn()
        sync(self.device)
        reps, least = (7, 0.05) if self.quick else (15, 0.5)
        times: list[float] = []
        spent = 0.0
        while len(times) < reps or (spent < least and len(times) < 1000):
            t0 = time.perf_counter()
            fn()
            sync(self.device)
            dt = time.perf_counter() - t0
            times.append(dt)
            spent += dt
            if len(times) >= 3 and spent > (0.5 if self.quick else 5.0):
                break
        return 1e3 * statistics.median(times)


# ---------------------------------------------------------------------------------------
# The model of sync, graph and compile


class UserModel(nn.Module):
    """Multi-head attention computed twice, as a user might: scores through ElasticSoftmax
    (one tau and beta per head, the key padding as -inf scores), and ElasticAttention
    (per head, causal) with the (B, 1, 1, L) bool key-padding mask; their sum projected."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.softmax = ElasticSoftmax(param_shape=(heads, 1, 1))
        self.attention = ElasticAttention(param_shape=(heads,), causal=True)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        q, k, v = (t.view(b, length, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, -1))
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        weights = self.softmax(scores.masked_fill(~key_mask, float("-inf")))
        o = weights @ v + self.attention(q, k, v, attn_mask=key_mask)
        return self.out(o.transpose(1, 2).reshape(b, length, d))


def model_sizes(run: Run) -> dict[str, int]:
    if run.quick:
        return {"batch": 2, "length": 16, "d_model": 32, "heads": 2}
    return {"batch": 4, "length": 256, "d_model": 256, "heads": 4}


def model_inputs(run: Run, seed: int = 0) -> tuple[UserModel, torch.Tensor, torch.Tensor]:
    """The model (in --dtype, weights from seed), an input batch in --dtype and its
    (B, 1, 1, L) bool key-padding mask (the later sequences shorter), all on the run's
    device."""
    s = model_sizes(run)
    dtype = DTYPES[run.args.dtype]
    torch.manual_seed(seed)
    model = UserModel(s["d_model"], s["heads"]).to(run.device, dtype)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(s["batch"], s["length"], s["d_model"], generator=g).to(run.device, dtype)
    lengths = torch.tensor([s["length"] - i * s["length"] // (2 * s["batch"])
                            for i in range(s["batch"])])
    mask = (torch.arange(s["length"])[None, :] < lengths[:, None])[:, None, None, :]
    return model, x, mask.to(run.device)


def loss_of(model: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return model(x, mask).float().square().mean()


def section_sync(run: Run, out: dict) -> None:
    model, x, mask = model_inputs(run)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out["dtype"] = run.args.dtype
    if run.device != "cuda":  # the eager step, for its launches; the check is CUDA's
        with launches.noting() as notes:
            loss = loss_of(model, x, mask)
            loss.backward()
        out.update(status="skipped", reason="cuda only", launches=list(notes),
                   eager_loss=float(loss.detach()))
        return
    phase = "forward"

    def step() -> torch.Tensor:
        nonlocal phase
        phase = "forward"
        loss = loss_of(model, x, mask)
        phase = "backward"
        opt.zero_grad(set_to_none=True)
        loss.backward()
        phase = "optimizer step"
        opt.step()
        return loss.detach()

    out["model"] = model_sizes(run)
    # the first step compiles the kernels and fills the optimizer's state: counted, not judged
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with launches.noting() as notes:
                step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    out["launches"] = list(notes)
    syncs = [str(w.message).splitlines()[0] for w in caught
             if "synchroniz" in str(w.message).lower()]
    out["warmup_step_sync_warnings"] = len(syncs)
    if syncs:
        out["warmup_step_first_warning"] = syncs[0][:240]
    torch.cuda.synchronize()
    losses = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            losses.append(step())
    except Exception as e:
        out.update(status="failed", reason=f"{phase}: {one_line(e)}", phase=phase,
                   where=where(e))
        return
    finally:
        torch.cuda.set_sync_debug_mode(0)
    out["losses"] = [float(v) for v in losses]
    if not all(math.isfinite(v) for v in out["losses"]):
        out.update(status="failed", reason=f"a loss is not finite: {out['losses']}")
        return
    out.update(status="passed", steps_checked=len(losses))


def section_graph(run: Run, out: dict) -> None:
    if run.device != "cuda":
        out.update(status="skipped", reason="cuda only")
        return
    model, x, mask = model_inputs(run)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    out["model"], out["dtype"] = model_sizes(run), run.args.dtype
    phase = "warm-up"
    try:
        # torch's recipe: warm up on a side stream, then capture on the graph's own
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss_of(model, x, mask).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        # the eager twin, from the state the graph starts from (deep copies: no aliasing)
        twin = copy.deepcopy(model)
        twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-3, capturable=True)
        twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        phase = "capture"
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with launches.noting() as notes, torch.cuda.graph(graph):
            static_loss = loss_of(model, x, mask)
            static_loss.backward()
            opt.step()
        out["launches"] = list(notes)
        torch.cuda.synchronize()
        phase = "replay"
        replayed = []
        for _ in range(3):
            graph.replay()
            replayed.append(static_loss.detach().clone())
        torch.cuda.synchronize()
        phase = "eager"
        eager = []
        for _ in range(3):
            twin_opt.zero_grad(set_to_none=True)
            loss = loss_of(twin, x, mask)
            loss.backward()
            twin_opt.step()
            eager.append(loss.detach())
        torch.cuda.synchronize()
    except Exception as e:
        out.update(status="failed", reason=f"{phase}: {one_line(e)}", phase=phase,
                   where=where(e))
        return
    got, want = [float(v) for v in replayed], [float(v) for v in eager]
    diffs = [rel_diff(a, b) for a, b in zip(got, want, strict=True)]
    params = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                 for a, b in zip(model.parameters(), twin.parameters(), strict=True))
    out.update(replayed_losses=got, eager_losses=want,
               loss_differences=[a - b for a, b in zip(got, want, strict=True)],
               max_rel_difference=max(diffs), params_max_rel_difference=params,
               tolerance=REL_TOL)
    ok = all(math.isfinite(v) for v in got + want) and max(diffs) <= REL_TOL
    out["status"] = "passed" if ok else "failed"
    if not ok:
        out["reason"] = (f"replayed losses {got} differ from eager {want} "
                         f"(max rel {max(diffs):.3g} > {REL_TOL})")


def section_compile(run: Run, out: dict) -> None:
    model, x, mask = model_inputs(run)
    params = list(model.parameters())
    out["model"], out["dtype"] = model_sizes(run), run.args.dtype
    eager_loss = loss_of(model, x, mask)
    eager_grads = torch.autograd.grad(eager_loss, params)
    compiled = torch.compile(model, fullgraph=True)
    t0 = time.perf_counter()
    try:
        with launches.noting() as notes:
            loss = compiled(x, mask).float().square().mean()
            grads = torch.autograd.grad(loss, params)
        out["launches"] = list(notes)
        sync(run.device)
    except Exception as e:
        out.update(status="failed", reason=one_line(e), where=where(e))
        return
    finally:
        out["first_call_s"] = round(time.perf_counter() - t0, 2)
    got, want = float(loss.detach()), float(eager_loss.detach())
    out.update(status="passed", compiled_loss=got, eager_loss=want,
               loss_rel_difference=rel_diff(got, want),
               grads_max_rel_difference=max(
                   ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                   for a, b in zip(grads, eager_grads, strict=True)))
    run.save()
    try:
        explained = torch._dynamo.explain(model)(x, mask)
        out.update(graph_breaks=explained.graph_break_count, graphs=explained.graph_count)
        if explained.break_reasons:
            out["first_break"] = str(explained.break_reasons[0].reason).splitlines()[0][:240]
    except Exception as e:  # the count is extra: its failure fails nothing
        out["graph_breaks"] = None
        out["explain"] = f"failed: {one_line(e)}"
    finally:
        torch._dynamo.reset()


# ---------------------------------------------------------------------------------------
# Timings


def measure(run: Run, out: dict, entry: dict, fn: Callable[[], Any] | None,
            skip: str | None = None) -> dict:
    """Time fn into entry (ms, or the reason it did not run), append it and save."""
    if skip is not None:
        entry.update(ms=None, status="skipped", reason=skip)
    else:
        try:
            assert fn is not None
            entry.update(ms=run.time(fn), status="ok")
        except Exception as e:
            entry.update(ms=None, status="failed", reason=one_line(e))
    out["entries"].append(entry)
    run.save()
    return entry


def raw_unavailable(run: Run) -> str | None:
    """Why the Triton kernels cannot be called directly here, None when they can."""
    if run.device == "cpu" and not interpreted():
        return "the Triton kernels run on CPU tensors only under TRITON_INTERPRET=1"
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def add_ratios(out: dict, keys: tuple[str, ...], pairs: tuple[tuple[str, str], ...]) -> None:
    """out["ratios"]: for each group (the entries' values of keys) and pass, num/den of the
    named implementations' times."""
    times: dict[tuple, float | None] = {}
    for e in out["entries"]:
        times[(*(e[k] for k in keys), e["impl"], e["pass"])] = e["ms"]
    groups = list(dict.fromkeys(tuple(e[k] for k in keys) for e in out["entries"]))
    out["ratios"] = [
        {**dict(zip(keys, group, strict=True)), "ratio": f"{num}/{den}", "pass": p,
         "value": ratio(times.get((*group, num, p)), times.get((*group, den, p)))}
        for group in groups for num, den in pairs for p in PASSES]


def section_rows(run: Run, out: dict) -> None:
    rows, n = (64, 256) if run.quick else (4096, 4096)
    out.update(shape=[rows, n], tau=TAU, beta=BETA, entries=[], public_implementation={})
    no_raw = raw_unavailable(run)
    raw = None
    if no_raw is None:
        try:
            from elasticbench.kernels.triton import elastic_backward as raw_bwd
            from elasticbench.kernels.triton import exp_family as raw_fwd
            raw = (raw_fwd.elastic_forward, raw_bwd.elastic_backward)
        except Exception as e:
            no_raw = f"the Triton kernels do not import: {one_line(e)}"
    g0 = torch.Generator().manual_seed(0)
    for dname, dtype in DTYPES.items():
        x = torch.randn(rows, n, generator=g0).to(run.device, dtype)
        g = torch.randn(rows, n, generator=g0).to(run.device, dtype)
        rows_of_dtype(run, out, dname, x, g, raw, no_raw)
    add_ratios(out, ("dtype",), (("public", "raw"), ("module", "raw"),
                                 ("public", "torch.softmax")))
    out["status"] = "ok"


def rows_of_dtype(run: Run, out: dict, dname: str, x: torch.Tensor, g: torch.Tensor,
                  raw: tuple[Callable, Callable] | None, no_raw: str | None) -> None:
    """The rows' entries of one dtype: x the input, g the upstream gradient."""
    from elasticbench.rows.spec import ExpSpec
    from elasticbench.rows.tiers import choose

    xr = x.detach().requires_grad_(True)
    out["public_implementation"][dname] = choose(x, ExpSpec(True, -math.inf, TAU, BETA)).name
    module = ElasticSoftmax().to(run.device)
    mparams = list(module.parameters())

    def entry(impl: str, p: str) -> dict:
        return {"dtype": dname, "impl": impl, "pass": p}

    def grad(y: torch.Tensor, inputs: list[torch.Tensor], keep: bool = False):
        return torch.autograd.grad(y, inputs, g, retain_graph=keep)

    # torch.softmax
    y_t = torch.softmax(xr, -1)
    measure(run, out, entry("torch.softmax", "fwd"), lambda: torch.softmax(x, -1))
    measure(run, out, entry("torch.softmax", "bwd"), lambda: grad(y_t, [xr], keep=True))
    measure(run, out, entry("torch.softmax", "fwd+bwd"),
            lambda: grad(torch.softmax(xr, -1), [xr]))
    # the raw Triton kernels, float tau and beta
    if raw is not None:
        fwd, bwd = raw
        y_r = fwd(x, TAU, BETA)
        measure(run, out, entry("raw", "fwd"), lambda: fwd(x, TAU, BETA))
        measure(run, out, entry("raw", "bwd"), lambda: bwd(y_r, g, x, TAU, BETA))
        measure(run, out, entry("raw", "fwd+bwd"),
                lambda: bwd(fwd(x, TAU, BETA), g, x, TAU, BETA))
    else:
        for p in PASSES:
            measure(run, out, entry("raw", p), None, skip=no_raw)
    # the public API, float tau and beta
    y_p = elastic_softmax(xr, TAU, BETA)
    measure(run, out, entry("public", "fwd"), lambda: elastic_softmax(x, TAU, BETA))
    measure(run, out, entry("public", "bwd"), lambda: grad(y_p, [xr], keep=True))
    measure(run, out, entry("public", "fwd+bwd"),
            lambda: grad(elastic_softmax(xr, TAU, BETA), [xr]))
    # the module, learnable tau and beta
    y_m = module(xr)
    measure(run, out, entry("module", "fwd"), lambda: module(x))
    measure(run, out, entry("module", "bwd"), lambda: grad(y_m, [xr, *mparams], keep=True))
    measure(run, out, entry("module", "fwd+bwd"), lambda: grad(module(xr), [xr, *mparams]))


def attention_flops(b: int, h: int, length: int, d: int, causal: bool, p: str) -> float:
    fwd = 4 * b * h * length * length * d / (2 if causal else 1)
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd+bwd": 3.5 * fwd}[p]


def section_attention(run: Run, out: dict) -> None:
    from elasticbench.attention.autograd import choose

    if run.quick:
        b, h, d, lengths = 1, 2, 16, [64]
    else:
        b, h, d = 4, 16, 128
        lengths = [int(v) for v in run.args.attention_lengths.split(",")]
    out.update(batch=b, heads=h, dim=d, lengths=lengths, dtype="bf16", tau=TAU, beta=BETA,
               entries=[], skipped=[])
    no_direct = raw_unavailable(run)
    kernel = None
    if no_direct is None:
        try:
            from elasticbench.kernels.triton import flash_attention as kernel
        except Exception as e:
            no_direct = f"the Triton kernels do not import: {one_line(e)}"
    g0 = torch.Generator().manual_seed(0)
    for i, length in enumerate(lengths):
        if i and run.left() < run.args.reserve:
            out["skipped"].append({"length": length,
                                   "reason": f"time is short ({run.left():.0f} s of the "
                                             f"budget left, {run.args.reserve:.0f} s wanted)"})
            run.save()
            continue
        qkvg = [torch.randn(b, h, length, d, generator=g0).to(run.device, torch.bfloat16)
                for _ in range(4)]
        out.setdefault("public_implementation", choose(qkvg[0]).name)
        for causal in (False, True):
            attention_case(run, out, qkvg, causal, kernel, no_direct)
        del qkvg
        if run.device == "cuda":
            torch.cuda.empty_cache()
    for e in out["entries"]:
        flops = attention_flops(b, h, e["length"], d, e["causal"], e["pass"])
        e["tflops"] = flops / (e["ms"] * 1e-3) / 1e12 if e["ms"] else None
    add_ratios(out, ("length", "causal"), (("public", "direct"), ("module", "direct"),
                                           ("public", "sdpa")))
    out["status"] = "ok"


def attention_case(run: Run, out: dict, qkvg: list[torch.Tensor], causal: bool,
                   kernel: Any, no_direct: str | None) -> None:
    """The attention entries of one length and causality: q, k, v and the upstream
    gradient in qkvg."""
    q, k, v, dout = qkvg
    b, h, length, d = q.shape
    qr, kr, vr = (t.detach().requires_grad_(True) for t in (q, k, v))
    module = ElasticAttention(param_shape=(h,), causal=causal).to(run.device)
    mparams = list(module.parameters())

    def entry(impl: str, p: str) -> dict:
        return {"length": length, "causal": causal, "impl": impl, "pass": p}

    def grad(o: torch.Tensor, extra: tuple = (), keep: bool = False):
        return torch.autograd.grad(o, (qr, kr, vr, *extra), dout, retain_graph=keep)

    def public(*qkv: torch.Tensor) -> torch.Tensor:
        return elastic_attention(*qkv, tau=TAU, beta=BETA, causal=causal)

    def sdpa(*qkv: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(*qkv, is_causal=causal)

    for name, f in (("public", public), ("sdpa", sdpa)):
        o = f(qr, kr, vr)
        measure(run, out, entry(name, "fwd"), lambda f=f: f(q, k, v))
        measure(run, out, entry(name, "bwd"), lambda o=o: grad(o, keep=True))
        measure(run, out, entry(name, "fwd+bwd"), lambda f=f: grad(f(qr, kr, vr)))
        del o
    # the module: learnable tau and beta per head
    o_m = module(qr, kr, vr)
    measure(run, out, entry("module", "fwd"), lambda: module(q, k, v))
    measure(run, out, entry("module", "bwd"), lambda o=o_m: grad(o, tuple(mparams), keep=True))
    measure(run, out, entry("module", "fwd+bwd"),
            lambda: grad(module(qr, kr, vr), tuple(mparams)))
    del o_m
    if kernel is None:
        for p in PASSES:
            measure(run, out, entry("direct", p), None, skip=no_direct)
        return
    # the Triton kernels called directly, (B, H) fp32 tau and beta
    tau = torch.full((b, h), TAU, dtype=torch.float32, device=q.device)
    beta = torch.full((b, h), BETA, dtype=torch.float32, device=q.device)
    scale = d ** -0.5
    fwd, bwd = kernel.attention_forward, kernel.attention_backward
    out_, m, den = fwd(q, k, v, tau, beta, scale, causal)

    def both():
        o_, m_, den_ = fwd(q, k, v, tau, beta, scale, causal)
        return bwd(q, k, v, o_, dout, m_, den_, tau, beta, scale, causal)

    measure(run, out, entry("direct", "fwd"), lambda: fwd(q, k, v, tau, beta, scale, causal))
    measure(run, out, entry("direct", "bwd"),
            lambda: bwd(q, k, v, out_, dout, m, den, tau, beta, scale, causal))
    measure(run, out, entry("direct", "fwd+bwd"), both)


# ---------------------------------------------------------------------------------------
# Tables


def print_section(console: Any, name: str, out: dict) -> None:
    from rich.table import Table

    status = out.get("status", "?")
    if name in ("sync", "graph", "compile") or "entries" not in out:
        table = Table(title=f"{name}: {status}", show_header=True)
        table.add_column("what")
        table.add_column("value", overflow="fold")
        for key, value in out.items():
            if key in ("status", "entries", "ratios"):
                continue
            if isinstance(value, float):
                value = fmt(value, 6)
            elif isinstance(value, list) and value and isinstance(value[0], float):
                value = ", ".join(fmt(v, 8) for v in value)
            table.add_row(key, str(value))
        console.print(table)
        return
    keys = ("dtype",) if name == "rows" else ("length", "causal")
    shape = (f"{out['shape'][0]}x{out['shape'][1]}" if name == "rows" else
             f"B={out['batch']} H={out['heads']} D={out['dim']} {out['dtype']}")
    impl = out.get("public_implementation")
    if isinstance(impl, dict):
        impl = ", ".join(f"{k} {v}" for k, v in impl.items())
    timed = Table(title=f"{name} ({shape}): ms{' (TFLOP/s)' if name == 'attention' else ''}; "
                        f"the public API runs {impl}")
    for col in (*keys, "impl", *PASSES):
        timed.add_column(col, justify="right" if col in PASSES else "left")
    skipped: dict[str, str] = {}
    rows: dict[tuple, dict[str, str]] = {}
    for e in out["entries"]:
        row = rows.setdefault((*(e[k] for k in keys), e["impl"]), {})
        if e["status"] != "ok":
            row[e["pass"]] = e["status"]
            skipped.setdefault(e["impl"], f"{e['status']}: {e['reason']}")
        else:
            row[e["pass"]] = fmt(e["ms"]) + (f" ({fmt(e['tflops'], 3)})" if e.get("tflops")
                                            else "")
    for key, row in rows.items():
        timed.add_row(*(str(v) for v in key), *(row.get(p, "") for p in PASSES))
    console.print(timed)
    for impl, why in skipped.items():
        console.print(f"  {impl}: {why}")
    for s in out.get("skipped", []):
        console.print(f"  length {s['length']} skipped: {s['reason']}")
    if out.get("ratios"):
        ratios = Table(title=f"{name}: ratios of times (lower is faster)")
        for col in (*keys, "ratio", *PASSES):
            ratios.add_column(col, justify="right" if col in PASSES else "left")
        grouped: dict[tuple, dict[str, str]] = {}
        for r in out["ratios"]:
            grouped.setdefault((*(r[k] for k in keys), r["ratio"]), {})[r["pass"]] = (
                f"{r['value']:.2f}" if r["value"] else "-")
        for key, row in grouped.items():
            ratios.add_row(*(str(v) for v in key), *(row.get(p, "") for p in PASSES))
        console.print(ratios)


# ---------------------------------------------------------------------------------------
# Main


RUNNERS: dict[str, Callable[[Run, dict], None]] = {
    "sync": section_sync, "graph": section_graph, "compile": section_compile,
    "rows": section_rows, "attention": section_attention,
}


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def sections(value: str) -> list[str]:
    names = [s.strip() for s in value.split(",") if s.strip()]
    bad = [s for s in names if s not in SECTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(SECTIONS)}; got {value!r}")
    return names


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="gpu_user_path.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny shapes (what the tests run)")
    p.add_argument("--json", metavar="PATH", help="write every result here, as it comes")
    p.add_argument("--only", type=sections, default=list(SECTIONS),
                   help=f"comma list of {', '.join(SECTIONS)} (default: all)")
    p.add_argument("--budget", type=float, default=220.0,
                   help="seconds the run should take at most: a later attention length is "
                        "skipped when less than --reserve is left (default 220)")
    p.add_argument("--reserve", type=float, default=60.0,
                   help="seconds a later attention length needs (default 60)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's CPU threads with --device cpu (default 1: the timings of one "
                        "core, undisturbed by a busy machine's scheduling of a second)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16",
                   help="the dtype of sync, graph and compile's model (default bf16)")
    p.add_argument("--attention-lengths", default="2048,8192",
                   help="comma list of attention lengths, not --quick (default 2048,8192)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (use --device cpu)")
    try:
        lengths = [int(v) for v in args.attention_lengths.split(",")]
        assert lengths and all(v > 0 for v in lengths)
    except (ValueError, AssertionError):
        p.error(f"--attention-lengths: positive integers, got {args.attention_lengths!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    run = Run(args)
    console.print(f"{run.doc['device']}; torch {run.doc['torch']}, triton {run.doc['triton']}, "
                  f"commit {run.doc['commit']}; timer: {run.doc['timer']}")
    failed = False
    for name in args.only:
        out: dict[str, Any] = {"status": "running"}
        run.doc["sections"][name] = out
        run.save()
        t0 = time.monotonic()
        try:
            RUNNERS[name](run, out)
        except Exception as e:  # one section failing must not stop the others
            out.update(status="failed", reason=one_line(e), where=where(e))
        finally:
            out["seconds"] = round(time.monotonic() - t0, 2)
            if args.device == "cuda":
                torch.cuda.set_sync_debug_mode(0)
                torch.cuda.empty_cache()
        failed |= out["status"] == "failed"
        run.save()
        print_section(console, name, out)
    console.print(f"done in {time.monotonic() - run.start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
