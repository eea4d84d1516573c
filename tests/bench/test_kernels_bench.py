"""Every built-in forward kernel (numpy and eager torch) on two fp32 shapes, for pytest-benchmark.

Never asserts on time. Each benchmark carries extra_info (kernel, case) that
`elasticbench compare`/`gate` read; save with --benchmark-save-data so the gate gets raw rounds.
"""

from __future__ import annotations

import pytest

from elasticbench.backends import get_backend
from elasticbench.bench.cases import RunCase
from elasticbench.bench.runner import params_for
from elasticbench.inputs import generate
from elasticbench.registry import list_kernels

SHAPES = [(64, 4096), (16, 65536)]


def _kernels():
    return [k for k in list_kernels(mode="fwd") if k.backend in ("numpy", "torch")
            and "compile" not in k.name]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("spec", _kernels(), ids=lambda k: k.name)
def test_kernel(benchmark, spec, shape):
    params = params_for(RunCase(name="bench"), spec.function)
    backend = get_backend(spec.backend)
    x = backend.to_native(generate("normal", "fp32", shape, 0))
    benchmark.extra_info.update({"kernel": spec.name, "function": spec.function,
                                 "backend": spec.backend, "dtype": "fp32",
                                 "case": f"fp32 {shape[0]}x{shape[1]}", "params": params})

    def call():
        spec.fn(x, **params)
        backend.synchronize()

    benchmark.pedantic(call, rounds=20, warmup_rounds=2, iterations=1)
