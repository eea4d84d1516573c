"""A kernel's pass model: how many times it sweeps memory and how many exponentials it takes.

Declared where the kernel is registered (see docs/benchmarking.md section 3):

    @register_kernel(function="elastic", backend="torch",
                     model=PassModel("three-pass", reads=3, writes=1, exps=2))
    def my_kernel(x, *, tau, beta): ...

reads/writes count full sweeps over the (rows, n) array; exps counts exponentials per
element. The benchmark gives a kernel that declares nothing the minimum of its function.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class PassModel:
    """Sweeps over memory and exponentials per element of one kernel."""

    structure: str
    reads: float
    writes: float
    exps: float
    declared: bool = True
    compute: str | None = None  # dtype the exponentials run in, when not the usual one

    def __post_init__(self) -> None:
        if self.reads < 1 or self.writes < 1 or self.exps < 0:
            raise ValueError("a kernel reads and writes at least once and computes exps >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
