"""The budgets are strict enough to catch real bugs and loose enough for real kernels.

torch's own fp32 softmax must pass; an output 1e-4 off (relative) must fail in fp32;
outputs far below any atol are not free; low-precision accumulation must fail on long rows.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from elasticbench.harness.numerics.truth.cache import TruthStore, solve
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.verify.matrix import VerifyCase
from elasticbench.harness.verify.verifier import prepare, verify_one


def check(fn, function, backend, generator, dtype, shape, max_elements=1 << 17, **params):
    """Verify an unregistered kernel on one case; return its record."""
    spec = KernelSpec("under_test", function, backend, fn)
    case = VerifyCase(function, generator, shape, dtype, tuple(params.items()), 11)
    (prep,) = prepare([case], max_elements, 128)
    (truth,) = solve([prep.job], TruthStore(None))
    return verify_one(spec, prep, truth).to_dict()


def vendor_softmax(x):
    return torch.softmax(x, dim=-1)


@pytest.mark.parametrize(("generator", "shape"),
                         [("normal", (16, 1024)), ("uniform", (8, 1000)), ("dominant", (4, 4096)),
                          ("normal", (4, 65536))])
def test_torch_softmax_fp32_passes(generator, shape):
    r = check(vendor_softmax, "softmax", "torch", generator, "fp32", shape)
    assert r["passed"], r["reason"]
    assert 0.5 < r["max_ulp"] < 50  # measured, not assumed: a real kernel is a few ulps off


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_relative_error_of_1e_4_fails(dtype):
    def off(x):
        return (torch.softmax(x, dim=-1) * (1 + 1e-4)).to(x.dtype)

    r = check(off, "softmax", "torch", "normal", dtype, (8, 256))
    assert not r["passed"] and r["reason"].startswith("accuracy")
    assert r["max_ulp"] > 800


def test_all_zero_output_fails_even_though_every_value_is_below_atol():
    def zeros(x):
        return np.zeros_like(x)

    # n = 65536: every softmax output is about 1.5e-5, below KernelBench's atol of 1e-2
    r = check(zeros, "softmax", "numpy", "normal", "fp32", (1, 65536))
    assert not r["passed"] and r["max_ulp"] > 1e6


def test_elastic_offset_not_rescaled_fails():
    def unscaled(x, *, tau, beta):
        s = np.where(x >= 0, x.astype(np.float64), -np.inf)
        e = np.exp((s - s.max(axis=-1, keepdims=True)) / tau)
        return (e / (e.sum(axis=-1, keepdims=True) + beta)).astype(x.dtype)

    assert not check(unscaled, "elastic", "numpy", "normal", "fp32", (8, 64),
                     tau=1.0, beta=1.0)["passed"]
    # invisible with the seed proposal's beta = 1e-10: the analysis says why the grid has 1
    assert check(unscaled, "elastic", "numpy", "normal", "fp32", (8, 64),
                 tau=1.0, beta=1e-10)["passed"]


def test_bf16_accumulation_fails_on_long_rows():
    def bf16_sum(x):
        e = np.exp(x.astype(np.float32) - x.astype(np.float32).max(axis=-1, keepdims=True))
        acc = np.zeros((x.shape[0], 1), dtype=ml_dtypes.bfloat16)
        for j in range(0, x.shape[1], 256):  # blocked, as a kernel would: partial sums in bf16
            acc = (acc + e[:, j:j + 256].sum(axis=-1, keepdims=True)).astype(ml_dtypes.bfloat16)
        return (e / acc.astype(np.float32)).astype(x.dtype)

    r = check(bf16_sum, "softmax", "numpy", "flat", "bf16", (1, 65536))
    assert not r["passed"]


def test_fp32_accumulation_for_bf16_passes_on_the_same_rows():
    def fp32_sum(x):
        xf = x.astype(np.float32)
        e = np.exp(xf - xf.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)

    assert check(fp32_sum, "softmax", "numpy", "flat", "bf16", (1, 65536))["passed"]
