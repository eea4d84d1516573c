"""Property-based: every built-in forward kernel against the exact reference on rows that
hypothesis generates, special values included, in every dtype."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elasticbench.harness.execute import call_kernel
from elasticbench.harness.functions import FUNCTIONS, get_function
from elasticbench.harness.numerics.budgets.row_budgets import budget_for
from elasticbench.harness.numerics.dtypes import DTYPE_NAMES, get_format
from elasticbench.harness.numerics.truth.row_truth import evaluate_rows
from elasticbench.harness.registry import list_kernels
from elasticbench.harness.verify.check import check_output

WIDTH = {"fp64": 64, "fp32": 32, "fp16": 16, "bf16": 32}
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0]


@st.composite
def rows(draw, dtype: str):
    """A (rows, n) input exactly representable in dtype, often with special values."""
    fmt = get_format(dtype)
    r = draw(st.integers(1, 3))
    n = draw(st.integers(1, 24))
    finite = st.floats(width=WIDTH[dtype], allow_nan=False, allow_infinity=False)
    scale = st.floats(-30, 30, width=WIDTH[dtype])  # most rows where exp is interesting
    value = st.one_of(scale, scale, finite, st.sampled_from(SPECIAL))
    values = draw(st.lists(value, min_size=r * n, max_size=r * n))
    x = np.array(values, dtype=np.float64).reshape(r, n)
    if dtype == "bf16":
        x = np.clip(x, -ml_dtypes.finfo(ml_dtypes.bfloat16).max,
                    ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    return fmt.cast(x)


def _params(function: str):
    fn = get_function(function)
    return st.fixed_dictionaries({p.name: st.sampled_from(p.grid) for p in fn.params})


def _compiled(spec) -> bool:
    return spec.fn.__module__.endswith("torch_variants")


def _compile_elsewhere(spec, dtype: str, shape: tuple[int, ...]) -> bool:
    """torch.compile specializes a dimension of size 1, so each of the compiled variants
    compiles again for one row and for one column, in every dtype: minutes on a fresh
    machine. Those shapes are drawn for them in fp32 here; in the other dtypes `make
    selftest` covers them (its quick matrix has 3x1 and 1x65537 rows in every format)."""
    return _compiled(spec) and dtype != "fp32" and min(shape) == 1


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.ci)],
                         ids=["eager", "compiled"])  # the compiled variants: .ci/run
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("function", list(FUNCTIONS))
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_builtin_kernels_match_the_reference(function, dtype, compiled, data):
    x = data.draw(rows(dtype), label="x")
    params = data.draw(_params(function), label="params")
    fmt = get_format(dtype)
    truth = evaluate_rows(function, params, x.astype(np.float64), np.arange(x.shape[0]))
    kernels = [k for k in list_kernels(function=function, mode="fwd")
               if _compiled(k) == compiled]
    if compiled and not kernels:
        pytest.skip(f"no torch.compile variant computes {function}")
    assert kernels
    # (a kernel that declares the formats it takes is given only those: Triton's, on a GPU)
    for spec in (k for k in kernels if k.source == "builtin" and not k.baseline
                 and k.supports(dtype) and not _compile_elsewhere(k, dtype, x.shape)):
        out = call_kernel(spec, x, params)
        assert out.error is None and not out.modified_input and not out.returned_input
        verdict = check_output(x, out.output, truth, fmt, budget_for(fmt))
        assert verdict.passed, f"{spec.name}: {verdict.reason} {verdict.worst}"
