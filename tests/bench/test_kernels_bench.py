"""Every built-in forward kernel (numpy and eager torch) on two fp32 shapes, for pytest-benchmark.

Never asserts on time. Each kernel is called as `elasticbench run` calls it: warmed up for the
default timing policy's warm-up, a sample spanning enough calls to last its minimum sample
time, and out of cache, cycling through copies of the input (elasticbench.harness.bench.rotation).
Each benchmark carries extra_info (kernel, case) that `elasticbench compare`/`gate` read; save
with --benchmark-save-data so the gate gets raw rounds, and run the suite several times (each
run is one process) to give the gate the spread between processes.
"""

from __future__ import annotations

import pytest

from elasticbench.harness.backends import get_backend
from elasticbench.harness.bench.cases import RunCase
from elasticbench.harness.bench.models import minimum_bytes
from elasticbench.harness.bench.rotation import rotating_call
from elasticbench.harness.bench.runner import params_for
from elasticbench.harness.bench.timing import Policy, counted, warm_up
from elasticbench.harness.inputs import generate
from elasticbench.harness.registry import list_kernels

SHAPES = [(64, 4096), (16, 524288)]  # 1 MiB in cache; 32 MiB, rotated out of a 32 MiB LLC
ROUNDS = 20


def _kernels():
    return [k for k in list_kernels(mode="fwd") if k.backend in ("numpy", "torch")
            and "compile" not in k.name]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("spec", _kernels(), ids=lambda k: k.name)
def test_kernel(benchmark, spec, shape):
    params = params_for(RunCase(name="bench"), spec.function)
    x = generate("normal", "fp32", shape, 0)
    call = rotating_call(spec, [x], params, minimum_bytes(*shape, x.itemsize, "fwd"))
    benchmark.extra_info.update({"kernel": spec.name, "function": spec.function,
                                 "backend": spec.backend, "dtype": "fp32",
                                 "case": f"fp32 {shape[0]}x{shape[1]}", "params": params,
                                 "rotated_buffers": call.copies})
    step, clock = counted(call), get_backend(spec.backend).clock()

    def run(k: int) -> float:
        clock.start()
        for _ in range(k):
            step()
        return clock.stop()

    inner = warm_up(run, Policy())
    benchmark.pedantic(step, rounds=ROUNDS, iterations=inner, warmup_rounds=0)
    call.release()
