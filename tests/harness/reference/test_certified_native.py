"""The fast reference's gradient sweeps in native code (kernels/cpp/reference_grad.cpp)
against their NumPy form (numerics/certified/rows_grad.py): the same double-double operations in
the same order, so dx and the parameter gradients must agree bit for bit, and the same rows
must be certified, on the property tests' inputs (every generator, values at the
thresholds, ties, repeated values, rows of several column blocks). The mpmath oracle checks
the native form (tests/harness/reference/test_certified.py runs it where the native tier is built, as verify's
reference processes do); this file holds the NumPy form to it, so the oracle's checks hold
for both."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_certified import (
    GRADIENT_FUNCTIONS,
    PROPERTY,
    _long_gradient_rows,
    drawn_input,
    repeating_input,
)

from elasticbench import native
from elasticbench.harness.functions import get_function
from elasticbench.harness.numerics.certified import (
    bounds,
    dd,
    native_sweeps,
    row_blocks,
)
from elasticbench.harness.numerics.certified import (
    rows_grad as certified_grad,
)
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.settings import overriding

pytestmark = pytest.mark.needs("native")


@pytest.fixture(autouse=True)
def _native_sweeps():
    """The sweeps in native code, as verify's reference processes run them (the harness's
    extension, built here if `make native` has not)."""
    native_sweeps.use_native(native.load_reference())
    yield
    native_sweeps.use_native(None)


def _both(fn, params, x, g, fmt) -> tuple[tuple, tuple]:
    """gradient_truth's answer from the native sweeps and from the NumPy ones."""
    assert native_sweeps.native_sweeps(fn) is not None
    rows = np.arange(x.shape[0])
    with np.errstate(all="ignore"):
        fast = certified_grad.gradient_truth(fn, params, x, g, rows, fmt)
        with overriding(reference="numpy"):  # as ELASTICBENCH_REFERENCE=numpy says
            slow = certified_grad.gradient_truth(fn, params, x, g, rows, fmt)
    return fast, slow


def _same(fast: tuple, slow: tuple, what) -> None:
    (a, ok_a, params_a), (b, ok_b, params_b) = fast, slow
    for field in ("dx_hi", "dx_lo", "dp_hi", "dp_lo", "dzero"):
        u, v = getattr(a, field), getattr(b, field)
        assert np.array_equal(u, v, equal_nan=u.dtype.kind == "f"), (field, what)
    assert np.array_equal(ok_a, ok_b) and params_a == params_b, what


def _upstream(x: np.ndarray, fmt, seed: int) -> np.ndarray:
    return fmt.cast(np.random.default_rng(seed).standard_normal(x.shape)).astype(np.float64)


def test_the_native_sweeps_use_the_numpy_forms_constants():
    """The constants reference_grad.cpp keeps are the ones the NumPy form uses."""
    want = [dd.U2, dd.ADD_DD, dd.ADD_D, dd.MUL_DD, dd.MUL_D, dd.DIV_D, dd.EXP_MIN,
            certified_grad.TINY, certified_grad.CUT, bounds.ABS_FLOOR,
            float(bounds.subnormal_floor(np.array([2.0**-1000]))[0])]
    assert native.load_reference().reference_constants() == want


def _drawn_case_matches(case, seed: int) -> None:
    fn, fmt, x, params = case
    _same(*_both(fn, params, x, _upstream(x, fmt, seed), fmt), (fn.name, params))


@settings(PROPERTY, max_examples=300)
@given(drawn_input(GRADIENT_FUNCTIONS), st.integers(0, 2**31))
def test_native_sweeps_match_numpy_on_drawn_inputs(case, seed):
    _drawn_case_matches(case, seed)


@settings(PROPERTY, max_examples=30)
@given(repeating_input(GRADIENT_FUNCTIONS), st.integers(0, 2**31))
def test_native_sweeps_match_numpy_on_repeated_values(case, seed):
    _drawn_case_matches(case, seed)


@pytest.mark.parametrize("dtype", ["fp64", "fp32", "bf16"])
def test_native_sweeps_match_numpy_over_column_blocks(dtype, monkeypatch):
    """Rows of several column blocks (the single top in a later block, ties for the top, a
    dominant logit); and the same rows with a block wider than the row."""
    fmt = get_format(dtype)
    x = _long_gradient_rows(fmt)
    g = _upstream(x, fmt, 3)
    for name in GRADIENT_FUNCTIONS:
        fn = get_function(name)
        for params in (fn.param_grid()[0], fn.param_grid()[-1]):
            _same(*_both(fn, params, x, g, fmt), (name, params))
            monkeypatch.setattr(certified_grad, "BLOCK", 1 << 40)
            _same(*_both(fn, params, x, g, fmt), (name, params, "one block"))
            monkeypatch.setattr(certified_grad, "BLOCK", row_blocks.BLOCK)


def test_the_native_sweeps_refuse_what_they_cannot_read():
    """A wrong dtype, shape or role is one error, not a read out of bounds."""
    import torch

    ext = native.load_reference()
    r, n = 2, 5
    f = [torch.zeros(r, n, dtype=torch.float64) for _ in range(5)]
    kept = torch.ones(r, n, dtype=torch.bool)
    fin = torch.ones(r, dtype=torch.bool)
    per_row = [torch.zeros(r, dtype=torch.float64) for _ in range(4)]
    out = [torch.zeros(r, n, dtype=torch.float64) for _ in range(3)]
    dp = [torch.zeros(r, 1, dtype=torch.float64) for _ in range(3)]
    args = (*f, kept, fin, *per_row, 1.0, 0.0)
    with pytest.raises(RuntimeError, match="unknown role"):
        ext.certified_grad_rows(*args, [7], 8192, 1.01, *out, *dp)
    with pytest.raises(RuntimeError, match="wrong shape"):
        ext.certified_grad_rows(*args, [0, 1], 8192, 1.01, *out, *dp)
    with pytest.raises(RuntimeError, match="dtype"):
        ext.certified_grad_rows(*f[:4], f[4].float(), kept, fin, *per_row, 1.0, 0.0, [0],
                                8192, 1.01, *out, *dp)


def _runs_native() -> bool:
    return native_sweeps.native_sweeps(get_function("elastic")) is not None


def test_verifys_reference_processes_run_the_native_sweeps():
    """A reference process (verify's and hunt's) takes the native sweeps at its start, even
    where its parent process runs the NumPy form."""
    from elasticbench.harness.verify.ahead import reference_process

    native_sweeps.use_native(None)
    with reference_process(1) as pool:
        assert pool.submit(_runs_native).result() is True
    assert not _runs_native()
