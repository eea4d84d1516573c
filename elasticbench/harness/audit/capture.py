"""Record the launches any Triton kernel wrapper makes, instead of running them.

Inside `capture_launches()` every `kernel[grid](...)` of a `triton.jit` function (directly, or
through `triton.heuristics` and `triton.autotune`, one launch per config) is recorded with its
arguments and not run, so a wrapper can be driven with CPU tensors on a machine without a GPU
and its launches compiled for one (`compile.compile_launch`). Outputs stay uninitialized.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class Launch:
    """One recorded launch: the JIT function, its positional arguments and its keywords
    (constexprs, num_warps and the other launch options, as the caller passed them)."""

    kernel: Any
    args: tuple
    kwargs: dict[str, Any]

    @property
    def num_warps(self) -> int:
        return int(self.kwargs.get("num_warps", 4))  # Triton's default

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__


@contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Within the block, Triton launches are recorded into the yielded list, not run."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append(Launch(self, args, kwargs))

    def every_config(self: Any, *args: Any, **kwargs: Any) -> None:
        for config in self.configs:
            self.fn.run(*args, **{**kwargs, **config.all_kwargs()})

    saved = JITFunction.__dict__["run"], Autotuner.__dict__["run"]
    JITFunction.run, Autotuner.run = record, every_config  # type: ignore[method-assign]
    try:
        yield launches
    finally:
        JITFunction.run, Autotuner.run = saved  # type: ignore[method-assign]
