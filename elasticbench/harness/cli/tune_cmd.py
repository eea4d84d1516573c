"""`elasticbench tune`: time the attention kernels' configurations on this GPU and write a
table the library loads (docs/attention.md section 7)."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from elasticbench.harness.cli.common import EXIT_OK, console, fail, quiet, split_names

# The keys timed, most wanted first (the budget may stop before the end): the family's
# weights, Elastic first; bf16 before fp16; head dim 128 (the issue's) before 64; the
# length classes 4096, 16384, 1024; not causal before causal; without key padding first.
FULL = {"dtypes": ("bf16", "fp16"), "head_dims": (128, 64), "lengths": (4096, 16384, 1024),
        "weights": ("elastic", "softmax1", "symax", "stablemax", "sigmoid")}
QUICK = {"dtypes": ("bf16",), "head_dims": (128,), "lengths": (4096,),
         "weights": ("elastic",)}  # under the interpreter: not causal, not padded, d 64
INTERPRETER_LENGTH = 40  # under TRITON_INTERPRET=1: plumbing at a tiny shape


@dataclass(frozen=True)
class Job:
    """One key to time: the kernel and the call's parameters (length: the length timed)."""

    kernel: str
    dtype: str
    head_dim: int
    length: int
    causal: bool
    padded: bool
    weight: str


def jobs(dtypes: tuple[str, ...], head_dims: tuple[int, ...], lengths: tuple[int, ...],
         weights: tuple[str, ...]) -> Iterator[Job]:
    """The keys in the order they are timed (see FULL)."""
    for weight in weights:
        for dtype in dtypes:
            for head_dim in head_dims:
                for length in lengths:
                    for causal in (False, True):
                        for padded in (False, True):
                            for kernel in ("fwd", "dkdv", "dq"):
                                yield Job(kernel, dtype, head_dim, length, causal, padded,
                                          weight)


def _shape(length: int, interpreted: bool) -> tuple[int, int]:
    """(batch, heads) timed at `length`: about 2^19 query rows in all (the issue's B=4 H=16
    at 8192), at least 4 x 1; under the interpreter 1 x 2."""
    if interpreted:
        return 1, 2
    rows = max(4, (1 << 19) // max(length, 1))
    return 4, max(1, rows // 4)


def _timer(interpreted: bool, quick: bool) -> Callable[[Callable[[], Any]], float]:
    """Median milliseconds of a function: do_bench's on a GPU; under the interpreter one
    wall-clock run (plumbing, not a GPU figure)."""
    if interpreted:
        def wall(fn: Callable[[], Any]) -> float:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        return wall
    import triton.testing

    def bench(fn: Callable[[], Any]) -> float:
        return float(triton.testing.do_bench(fn, warmup=10 if quick else 25,
                                             rep=40 if quick else 100, return_mode="median"))
    return bench


def _operands(job: Job, device: str, interpreted: bool) -> dict[str, Any]:
    import torch

    from elasticbench.attention.weights import Weight
    from elasticbench.kernels.triton import attention_configs as ac
    from elasticbench.kernels.triton.flash_attention import attention_forward

    b, h = _shape(job.length, interpreted)
    dtype = ac.DTYPES[job.dtype]
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, job.length, job.head_dim, generator=g, device=device)
                   .to(dtype) for _ in range(4))
    p_score = torch.full((b, h), 0.7, device=device)
    p_den = torch.full((b, h), 0.5, device=device)
    keep = None
    if job.padded:  # the last quarter of each row's keys padded
        keep = (torch.arange(job.length, device=device) < (3 * job.length) // 4)[None]
        keep = keep.expand(b, job.length).contiguous()
    weight = Weight[job.weight.upper()]
    scale = job.head_dim ** -0.5
    out, m, den = attention_forward(q, k, v, p_score, p_den, scale, job.causal, keep, weight,
                                    tile=ac.smallest(ac.configs("fwd", job.head_dim, dtype,
                                                                job.causal, weight,
                                                                padded=job.padded)))
    return {"q": q, "k": k, "v": v, "do": do, "p_score": p_score, "p_den": p_den, "keep": keep,
            "weight": weight, "scale": scale, "out": out, "m": m, "den": den}


def _time_job(job: Job, ops: dict[str, Any], options: tuple, bench: Callable,
              deadline: float) -> tuple[Any, dict] | None:
    """(fastest, timings) of the job's options, or None when the budget ran out first. The
    backward kernels are timed as a whole backward with the other kernel's rule choice."""
    from elasticbench.kernels.triton import attention_configs as ac
    from elasticbench.kernels.triton.flash_attention import attention_backward, attention_forward

    o = ops
    if job.kernel == "fwd":
        def call(t):
            return lambda: attention_forward(o["q"], o["k"], o["v"], o["p_score"], o["p_den"],
                                             o["scale"], job.causal, o["keep"], o["weight"],
                                             tile=t)
    else:
        dtype, w = ac.DTYPES[job.dtype], o["weight"]
        other = "dq" if job.kernel == "dkdv" else "dkdv"
        fixed = ac.rule(ac.configs(other, job.head_dim, dtype, job.causal, w,
                                   padded=job.padded))

        def call(t):
            pair = (t, fixed) if job.kernel == "dkdv" else (fixed, t)
            return lambda: attention_backward(o["q"], o["k"], o["v"], o["out"], o["do"],
                                              o["m"], o["den"], o["p_score"], o["p_den"],
                                              o["scale"], job.causal, o["keep"], w, tiles=pair)

    def time_one(t) -> float:
        if time.monotonic() > deadline:
            raise _OutOfBudget
        return bench(call(t))

    try:
        return ac.tune(options, time_one, f"{job.kernel} attention")
    except _OutOfBudget:
        return None


class _OutOfBudget(Exception):
    pass


def _parse_ints(text: str, what: str, allowed: Callable[[int], bool]) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in split_names([text]))
    except ValueError:
        fail(f"--{what} must be comma-separated integers, got {text!r}")
    if not values or not all(allowed(v) for v in values):
        fail(f"--{what}: {text!r} is out of range (see --help)")
    return values


def _write(path: Path, meta: dict, entries: list[dict]) -> None:
    """The table as load_table reads it, replaced atomically (a kill leaves the last one)."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps({**meta, "entries": entries}, indent=1) + "\n")
    os.replace(tmp, path)


@click.command("tune")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="attention-table.json",
              show_default=True, help="The table file to write (rewritten after each key).")
@click.option("--budget", type=float, default=None, metavar="SECONDS",
              help="Start no timing after this many seconds; the keys done are written.")
@click.option("--quick", is_flag=True,
              help="A small subset: bf16, head dim 128, Elastic, length class 4096.")
@click.option("-d", "--dtypes", default=None, metavar="LIST", help="Of bf16, fp16.")
@click.option("--head-dims", default=None, metavar="LIST", help="Of 64, 128.")
@click.option("--lengths", default=None, metavar="LIST",
              help="Sequence lengths to time (each stands for its length class).")
@click.option("--weights", default=None, metavar="LIST",
              help="Of elastic, softmax1, symax, stablemax, sigmoid.")
def tune(out_path: str, budget: float | None, quick: bool, dtypes: str | None,
         head_dims: str | None, lengths: str | None, weights: str | None) -> None:
    """Time every offered attention configuration (forward, dk/dv, dq) on this GPU per key
    (dtype, head dim, causal, key padding, weight, length class; triton.testing.do_bench
    medians) and write the fastest as a table the library loads: keep it, and point
    ELASTICBENCH_ATTENTION_TABLE at it (docs/attention.md section 7). Without a CUDA GPU it
    exits 2, except under TRITON_INTERPRET=1, where it runs its plumbing at tiny shapes and
    marks the file as interpreter timings (never a GPU table)."""
    start = time.monotonic()
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        fail(f"--budget must be a positive number of seconds, got {budget}")
    import torch

    from elasticbench.devices import triton_interpreted

    interpreted = triton_interpreted()
    if not interpreted and not torch.cuda.is_available():
        fail("elasticbench tune needs a CUDA GPU (torch sees none); under TRITON_INTERPRET=1 "
             "it runs its plumbing on the CPU at tiny shapes")
    base = QUICK if quick else FULL
    picked_dtypes = tuple(split_names([dtypes])) if dtypes else base["dtypes"]
    if not picked_dtypes or any(d not in ("bf16", "fp16") for d in picked_dtypes):
        fail(f"--dtypes: choose from bf16, fp16 (fp32 has one configuration), got {dtypes!r}")
    dims = _parse_ints(head_dims, "head-dims", lambda v: v in (64, 128)) if head_dims \
        else base["head_dims"]
    lens = _parse_ints(lengths, "lengths", lambda v: 1 <= v <= 1 << 20) if lengths \
        else base["lengths"]
    from elasticbench.attention.weights import Weight

    names = tuple(w.name.lower() for w in Weight)
    picked_weights = tuple(split_names([weights])) if weights else base["weights"]
    if not picked_weights or any(w not in names for w in picked_weights):
        fail(f"--weights: choose from {', '.join(names)}, got {weights!r}")
    if interpreted:  # plumbing: a tiny length; --quick one key per kernel at head dim 64
        lens = (INTERPRETER_LENGTH,)
        if quick and not head_dims:
            dims = (64,)
    path = Path(out_path)
    if path.parent and not path.parent.is_dir():
        fail(f"--out {out_path}: no directory {path.parent}")

    import triton

    from elasticbench.harness.environment import recorded_versions
    from elasticbench.kernels.triton import attention_configs as ac

    device = "cpu" if interpreted else "cuda"
    if interpreted:
        gpu = ac.Gpu((0, 0), "Triton interpreter")
        tma = ac.tma_available()
    else:
        gpu = ac.gpu_of(torch.device("cuda", torch.cuda.current_device()))
        tma = ac.tma_available() and gpu.capability >= (9, 0)
    versions = recorded_versions()
    meta = {"format": ac.TABLE_FORMAT, "version": ac.TABLE_VERSION,
            "interpreter": interpreted,
            "written": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "gpu": gpu.name, "capability": list(gpu.capability),
            "triton": triton.__version__, "torch": torch.__version__,
            "elasticbench": versions.get("elasticbench"), "tma_offered": tma,
            "complete": False}
    if interpreted:
        meta["note"] = ("timings from Triton's CPU interpreter at a tiny shape: plumbing "
                        "only, never to be committed or used as a GPU table")
    todo = list(jobs(picked_dtypes, dims, lens, picked_weights))
    if interpreted and quick:
        todo = [j for j in todo if not j.causal and not j.padded]
    deadline = math.inf if budget is None else start + budget
    bench = _timer(interpreted, quick)
    entries: list[dict] = []
    rows: list[tuple] = []
    err = console(stderr=True)
    ops_cache: dict[tuple, dict] = {}
    stopped = False
    for i, job in enumerate(todo):
        if time.monotonic() > deadline:
            stopped = True
            break
        shape_key = (job.dtype, job.head_dim, job.length, job.causal, job.padded, job.weight)
        if shape_key not in ops_cache:
            ops_cache.clear()  # one shape's operands alive at a time
            ops_cache[shape_key] = _operands(job, device, interpreted)
        dtype = ac.DTYPES[job.dtype]
        weight = Weight[job.weight.upper()]
        options = ac.offered(job.kernel, job.head_dim, dtype, job.causal, weight, tma,
                             job.padded)
        key = ac.Key(gpu, job.kernel, job.dtype, ac.head_dim_class(job.head_dim), job.causal,
                     job.padded, job.weight, ac.length_class(job.length))
        found = _time_job(job, ops_cache[shape_key], options, bench, deadline)
        if found is None:
            stopped = True
            break
        best, timings = found
        b, h = _shape(job.length, interpreted)
        entries.append(ac.entry_record(
            key, best, ms=round(timings[best], 5),
            timings={str(t): (None if math.isinf(ms) else round(ms, 5))
                     for t, ms in timings.items()},
            shape=[b, h, job.length, job.head_dim]))
        _write(path, meta, entries)
        finite = sorted(ms for ms in timings.values() if math.isfinite(ms))
        rows.append((key, best, timings[best], finite[1] / finite[0] if len(finite) > 1
                     and finite[0] > 0 else None, len(options)))
        if not quiet():
            err.print(f"  [{i + 1}/{len(todo)}] {key}: {best} {timings[best]:.3f} ms "
                      f"({time.monotonic() - start:.0f} s)")
    meta["complete"] = not stopped
    _write(path, meta, entries)
    _print(rows, gpu, interpreted)
    spent = time.monotonic() - start
    tail = f"; the budget ({budget:g} s) stopped it" if stopped else ""
    click.echo(f"tuned {len(entries)} of {len(todo)} keys on {gpu.name} in {spent:.0f} s"
               f"{tail}; wrote {path}" + (" (interpreter timings: not a GPU table)"
                                         if interpreted else ""))
    raise SystemExit(EXIT_OK)


def _print(rows: list[tuple], gpu: Any, interpreted: bool) -> None:
    title = f"attention configurations chosen on {gpu.name}" + \
        (" (interpreter timings)" if interpreted else "")
    table = Table(title=title)
    for col in ("kernel", "dtype", "head dim", "length class", "causal", "padded", "weight",
                "chosen", "ms", "next / best", "offered"):
        table.add_column(col, justify="right" if col in ("ms", "next / best", "offered",
                                                         "head dim", "length class")
                         else "left")
    for key, best, ms, ratio, n in rows:
        table.add_row(key.kernel, key.dtype, str(key.head_dim), str(key.length),
                      "yes" if key.causal else "no", "yes" if key.padded else "no",
                      key.weight, str(best), f"{ms:.3f}",
                      "-" if ratio is None else f"{ratio:.2f}", str(n))
    console().print(table)
