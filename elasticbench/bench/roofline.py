"""The two ceilings of docs/benchmarking.md section 1, measured on this machine in this run.

memory: a STREAM-style copy (bytes read + bytes written per second) on buffers at least
4x the last-level cache (CPU) or a device-to-device copy (GPU);
compute: elements per second of an in-cache exponential, per dtype.
A kernel's roof is the lower of copy_bw / (its bytes per element) and exp_rate / (its exps
per element); the ceiling that gives the lower value binds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import devices
from ..passes import PassModel
from .timing import Policy, Timing, time_calls

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


def _exp_sum(t: Any) -> Any:
    import torch

    return torch.exp(t).sum(-1)


def measure_exp(device: str, dtype: str, policy: Policy, elements: int = 1 << 21
                ) -> tuple[float, Timing]:
    """Elements/s of the fastest exponential this backend offers, on an in-cache buffer.

    Two probes: eager torch.exp into a preallocated output, and an inductor-fused exp and
    sum (vectorized, nothing written back), which is how a fused kernel meets exp. The
    eager probe alone understates the ceiling: torch.softmax itself outruns it (measured
    2.8 G/s against 2.4 on the 2-core CPU machine, while the fused probe reaches 5.5).
    """
    import torch

    x = torch.linspace(-10, 0, elements, device=device).to(_torch_dtype(dtype))
    y = torch.empty_like(x)
    clock = devices.clock(device)
    best = time_calls(lambda i: torch.exp(x, out=y), policy, clock)
    best.extra["probe"] = "torch.exp"
    try:
        fused = torch.compile(_exp_sum, dynamic=False)
        rows = x.view(16, -1)
        fused(rows)  # compile outside the timed span
        t = time_calls(lambda i: fused(rows), policy, clock)
        t.extra["probe"] = "inductor exp+sum"
        if t.stats.median_ns < best.stats.median_ns:
            best = t
    except Exception as e:  # no compiler here: the eager probe stands, and says so
        best.extra["fused_probe_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    return elements / (best.stats.median_ns * 1e-9), best


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
