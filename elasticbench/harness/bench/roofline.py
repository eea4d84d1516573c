"""The two ceilings of docs/benchmarking.md section 1, measured on this machine in this run.

memory: a STREAM-style copy (bytes read + bytes written per second) on buffers at least
4x the last-level cache (CPU) or a device-to-device copy (GPU);
compute: elements per second of an in-cache exponential, per dtype.
A kernel's roof is the lower of copy_bw / (its bytes per element) and exp_rate / (its exps
per element); the ceiling that gives the lower value binds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from elasticbench import devices
from elasticbench.harness.bench.timing import Policy, Timing, time_calls
from elasticbench.harness.passes import PassModel

TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
MIB = 1 << 20


def compute_dtype(dtype: str) -> str:
    """The precision the built-in kernels compute in: fp64 stays, the others work in fp32."""
    return "fp64" if dtype == "fp64" else "fp32"


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, TORCH_DTYPES[name])


def measure_copy(device: str, llc_bytes: int, policy: Policy) -> tuple[float, Timing, int]:
    """Copy bandwidth in bytes/s (read + write) on buffers of max(4 x LLC, 64 MiB) each."""
    import torch

    size = max(4 * llc_bytes, 64 * MIB)
    src = torch.ones(size // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)
    t = time_calls(lambda i: dst.copy_(src), policy, devices.clock(device), cold=True)
    return 2 * size / (t.stats.median_ns * 1e-9), t, size


EXP_CHAIN = 16  # exponentials per element in the chained probe


def _exp_sum(t: Any) -> Any:
    import torch

    return torch.exp(t).sum(-1)


def _exp_chain(t: Any) -> Any:
    import torch

    for _ in range(EXP_CHAIN):  # exp(-t) keeps every value in (0, e^10]: no inf, no NaN
        t = torch.exp(-t)
    return t


def measure_exp(device: str, dtype: str, policy: Policy,
                offered: dict[str, Callable[[Any], Any]] | None = None,
                elements: int = 1 << 21) -> tuple[float, Timing]:
    """Exponentials per second, the fastest this device offers, on an in-cache buffer.

    Probes: eager torch.exp into a preallocated output; the compiled exp+sum (nothing
    written back) of each backend tier of this device that offers one (`offered`, name ->
    f(x) -> sum exp(x): the native C++ tier on the host), which is how a fused kernel meets
    exp; and where no tier offers one, inductor's: an exp+sum, and a chain of EXP_CHAIN
    exponentials per element loaded, which keeps a GPU's special-function units busy where
    one exp per element leaves it waiting on memory and launches (on the H100 the exp+sum
    probe measured 217 G/s in fp32, below what the softmax kernels reach). Inductor is left
    out where a tier of the device offers its own probe: compiling it cost every `run` 4 s
    (a fresh machine a minute of C++ builds), and on the 2-core host the native exp+sum
    outran every other probe in every format (docs/benchmarking.md section 1).
    """
    import torch

    x = torch.linspace(-10, 0, elements, device=device).to(_torch_dtype(dtype))
    y = torch.empty_like(x)
    clock = devices.clock(device)
    probes: dict[str, tuple[Callable[[int], Any], int]] = {
        "torch.exp": (lambda i: torch.exp(x, out=y), 1)}
    errors: dict[str, str] = {}
    for name, fn in (offered or {}).items():
        probes[name] = (partial(_call_with, fn, x), 1)
    compiled = [] if offered else [("inductor exp+sum", _exp_sum, x.view(16, -1), 1),
                                   ("inductor exp chain", _exp_chain, x, EXP_CHAIN)]
    for name, fn, arg, exps in compiled:
        try:
            compiled_fn = torch.compile(fn, dynamic=False)
            compiled_fn(arg)  # compile outside the timed span
        except Exception as e:  # no compiler here: the other probes stand, and say so
            errors[name] = f"{type(e).__name__}: {e}".splitlines()[0]
            continue
        probes[name] = (partial(_call_with, compiled_fn, arg), exps)
    best: tuple[float, Timing] = (0.0, None)  # type: ignore[assignment]
    for name, (call, exps) in probes.items():
        t = time_calls(call, policy, clock)
        t.extra["probe"] = name
        rate = exps * elements / (t.stats.median_ns * 1e-9)
        if rate > best[0]:
            best = (rate, t)
    if errors:
        best[1].extra["probe_errors"] = errors
    return best


def _call_with(fn: Callable[[Any], Any], arg: Any, i: int) -> Any:
    return fn(arg)


@dataclass(frozen=True)
class Roof:
    """A kernel's ceilings for one shape, in elements per second."""

    memory_eps: float  # copy bandwidth / the kernel's own bytes per element
    exp_eps: float  # exp throughput / the kernel's exps per element (inf when none)
    ideal_memory_eps: float  # copy bandwidth / the minimum bytes per element

    @property
    def roof_eps(self) -> float:
        return min(self.memory_eps, self.exp_eps)

    @property
    def binding(self) -> str:
        return "exp" if self.exp_eps < self.memory_eps else "memory"

    def to_dict(self) -> dict[str, Any]:
        return {"memory_eps": self.memory_eps, "exp_eps": self.exp_eps,
                "ideal_memory_eps": self.ideal_memory_eps, "roof_eps": self.roof_eps,
                "binding": self.binding}


def roof_for(model: PassModel, minimum: PassModel, itemsize: int, copy_bps: float,
             exp_eps: float) -> Roof:
    """The roof of a kernel with this model on elements of this size."""
    own = (model.reads + model.writes) * itemsize
    ideal = (minimum.reads + minimum.writes) * itemsize
    exp_ceiling = exp_eps / model.exps if model.exps > 0 else float("inf")
    return Roof(copy_bps / own, exp_ceiling, copy_bps / ideal)
