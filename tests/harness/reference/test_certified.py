"""The certified fast reference against the mpmath oracle (docs/numerics.md section 6).

Wherever the double-double evaluation certifies a value, mpmath at 256 bits must lie within
its bound (forward) or within 2^-12 ulp (dx, the parameter gradients): the claim the fast
phase makes, tested on the adversarial generators, mixes with values near every threshold,
every function, forward and backward, every dtype. ELASTICBENCH_PROPERTY_ELEMENTS sets how
many elements each function and mode sees (CI runs 10^6).
"""

from __future__ import annotations

import math
import os

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elasticbench import native
from elasticbench.harness.functions import FUNCTION_NAMES, get_function
from elasticbench.harness.inputs.generators import GENERATORS, generate
from elasticbench.harness.numerics.certified import (
    bounds,
    dd,
    native_sweeps,
    row_blocks,
)
from elasticbench.harness.numerics.certified import (
    rows_forward as certified,
)
from elasticbench.harness.numerics.certified import (
    rows_grad as certified_grad,
)
from elasticbench.harness.numerics.dtypes import DTYPE_NAMES, get_format, work_format
from elasticbench.harness.numerics.truth.row_truth import evaluate_rows
from elasticbench.harness.numerics.ulp import ulp_of

ELEMENTS = int(float(os.environ.get("ELASTICBENCH_PROPERTY_ELEMENTS", "3000")))


@pytest.fixture(autouse=True, scope="module")
def _sweeps_as_verify_runs_them():
    """The backward's sweeps in native code where the native tier is built, as verify's
    reference processes run them (tests/harness/reference/test_certified_native.py: the NumPy form's bits)."""
    native_sweeps.use_native(native.built())
    yield
    native_sweeps.use_native(None)


ROW = 96  # one of the drawn row lengths
ORACLE_BITS = 256  # values compared within bounds, never scored in ulps: no SIDE_BITS rows
GRADIENT_FUNCTIONS = [f for f in FUNCTION_NAMES if get_function(f).gradient_row is not None]


def test_exp_is_within_its_bound():
    rng = np.random.default_rng(1)
    z = -np.concatenate([rng.uniform(0, 1, 3000), rng.uniform(0, 760, 3000),
                         rng.exponential(1e-3, 1000),
                         [0.0, 1e-300, 745.13, 745.2, 744.4, 708.4, 708.3, 700.0,
                          math.log(2) / 2048, 759.99, 760.0, 760.01]])
    zl = z * rng.uniform(-1, 1, z.size) * 2.0**-54
    h, lo = dd.exp(z, zl)
    with mpmath.workprec(320):
        for i in range(z.size):
            v = mpmath.exp(mpmath.mpf(z[i]) + mpmath.mpf(zl[i]))
            err = abs(mpmath.mpf(h[i]) + mpmath.mpf(lo[i]) - v)
            cut = z[i] < dd.EXP_MIN
            allowed = v if cut else dd.EXP_REL * v + dd.EXP_ABS
            assert err <= allowed, (z[i], float(err), float(allowed))


def test_the_operations_meet_their_stated_bounds():
    """Each dd operation, on random operands of mixed signs and sizes, within its bound."""
    rng = np.random.default_rng(2)
    n = 4000
    a = rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)
    b = rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)
    al, bl = a * rng.uniform(-1, 1, n) * 2.0**-54, b * rng.uniform(-1, 1, n) * 2.0**-54
    cases = {
        "add": (dd.add(a, al, b, bl), lambda x, y: x + y, dd.ADD_DD),
        "mul": (dd.mul(a, al, b, bl), lambda x, y: x * y, dd.MUL_DD),
        "div": (dd.div(a, al, b, bl), lambda x, y: x / y, dd.DIV_DD),
        "mul_d": (dd.mul_d(a, al, b), None, dd.MUL_D),
        "div_d": (dd.div_d(a, al, b), None, dd.DIV_D),
        "add_d": (dd.add_d(a, al, b), None, dd.ADD_D),
    }
    with mpmath.workprec(320):
        for name, ((h, lo), op, bound) in cases.items():
            for i in range(0, n, 7):
                x = mpmath.mpf(a[i]) + mpmath.mpf(al[i])
                y = mpmath.mpf(b[i]) + (mpmath.mpf(bl[i]) if op is not None else 0)
                exact = {"add": x + y, "mul": x * y, "div": x / y, "mul_d": x * y,
                         "div_d": x / y, "add_d": x + y}[name]
                err = abs(mpmath.mpf(h[i]) + mpmath.mpf(lo[i]) - exact)
                assert err <= bound * dd.U2 * abs(exact), (name, i)


# ---------------------------------------------------------------------------------------
# Property tests: drawn inputs, certified values against the oracle.

THRESHOLDS = {  # values next to which something changes, per format (filled in per draw)
    "exp_range": lambda fmt: [fmt.ln_max, -fmt.ln_max, 745.13, 708.4, 88.72, 11.09],
    "zeros": lambda fmt: [0.0, -0.0, 2.0 ** (fmt.emin - fmt.p + 1), 2.0**fmt.emin],
    "huge": lambda fmt: [fmt.max, -fmt.max, fmt.max / 2],
    "specials": lambda fmt: [np.inf, -np.inf, np.nan],
}


@st.composite
def drawn_input(draw, functions: list[str]):
    fn = get_function(draw(st.sampled_from(functions)))
    dtype = draw(st.sampled_from(DTYPE_NAMES))
    fmt = get_format(dtype)
    rows = draw(st.integers(*ROWS))
    n = draw(st.sampled_from(COLUMNS))
    x = generate(draw(st.sampled_from(sorted(GENERATORS))), dtype, (rows, n),
                 draw(st.integers(0, 2**31)))
    x = x.astype(np.float64)
    if draw(st.booleans()):  # values at the thresholds, in random places
        kind = draw(st.sampled_from(sorted(THRESHOLDS)))
        values = THRESHOLDS[kind](fmt)
        k = draw(st.integers(1, max(1, x.size // 8)))
        rng = np.random.default_rng(draw(st.integers(0, 2**31)))
        flat = x.reshape(-1)
        flat[rng.choice(x.size, size=k)] = rng.choice(values, size=k)
        x = fmt.cast(flat.reshape(x.shape)).astype(np.float64)
    if draw(st.booleans()):  # ties: a quarter of each row equal to its first value
        x[:, : max(1, n // 4)] = x[:, :1]
    params = {}
    for p in fn.params:
        lo, hi = p.span
        v = float(np.exp(draw(st.floats(math.log(lo), math.log(hi)))))
        params[p.name] = draw(st.sampled_from([v, *p.grid]))
    params = fn.validate_params(params)
    return fn, fmt, x, params


ROWS = (1, 4)
COLUMNS = [1, 2, 3, 7, 64, ROW, 257, 1000]
MEAN_ELEMENTS = (ROWS[0] + ROWS[1]) / 2 * sum(COLUMNS) / len(COLUMNS)  # of one drawn input


def _examples(functions: list[str]) -> int:
    """Examples for ELEMENTS elements per function, on average, over these functions."""
    return max(10, math.ceil(ELEMENTS * len(functions) / MEAN_ELEMENTS))


PROPERTY = settings(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@settings(PROPERTY, max_examples=_examples(list(FUNCTION_NAMES)))
@given(drawn_input(list(FUNCTION_NAMES)))
def test_certified_outputs_hold_against_mpmath(case):
    _forward_holds(*case)


@settings(PROPERTY, max_examples=_examples(GRADIENT_FUNCTIONS))
@given(drawn_input(GRADIENT_FUNCTIONS), st.integers(0, 2**31))
def test_certified_gradients_hold_against_mpmath(case, seed):
    _gradients_hold(*case, seed)


def _forward_holds(fn, fmt, x, params) -> None:
    """Wherever a row is certified, mpmath lies within every output's bound."""
    with np.errstate(all="ignore"):
        out = certified.forward(fn, params, x)
    ok = certified.certified_rows(out, fmt)
    oracle = evaluate_rows(fn.name, params, x, np.arange(x.shape[0]), ORACLE_BITS, sides=False)
    assert (out.kind == oracle.kind).all()
    for k in np.flatnonzero(ok):
        if oracle.kind[k] == "nan":
            assert np.isnan(out.hi[k]).all()
            continue
        assert (out.zero[k] == oracle.zero[k]).all()
        diff = np.abs((out.hi[k] - oracle.hi[k]) + (out.lo[k] - oracle.lo[k]))
        slack = np.abs(oracle.hi[k]) * 2.0 ** -(ORACLE_BITS - 2)
        assert (diff <= out.bound[k] + slack).all(), (fn.name, fmt.name, params, x[k])
        # a `rounded` output (below 2^-960) holds what float64 can of y, as the oracle's does
        tiny = out.rounded[k]
        assert (out.hi[k][tiny] + out.lo[k][tiny] == oracle.hi[k][tiny] + oracle.lo[k][tiny]).all()
        assert (out.bound[k][~tiny] <= bounds.CERTIFY_ULP
                * ulp_of(oracle.hi[k], oracle.lo[k], fmt)[~tiny] + slack[~tiny]).all()


def _gradients_hold(fn, fmt, x, params, seed) -> None:
    """Wherever a row is certified, mpmath's dx lies within 2^-12 ulp; the parameter
    gradients, where certified, within 2^-12 units of the working precision."""
    g = fmt.cast(np.random.default_rng(seed).standard_normal(x.shape)).astype(np.float64)
    rows = np.arange(x.shape[0])
    with np.errstate(all="ignore"):
        truth, ok, params_ok = certified_grad.gradient_truth(fn, params, x, g, rows, fmt)
    oracle = evaluate_rows(fn.name, params, x, rows, ORACLE_BITS, g, sides=False)
    ulp = ulp_of(np.nan_to_num(oracle.dx_hi), np.nan_to_num(oracle.dx_lo), fmt)
    for k in np.flatnonzero(ok):
        if oracle.kind[k] == "nan":
            assert np.isnan(truth.dx_hi[k]).all()
            continue
        assert (truth.dzero[k] == oracle.dzero[k]).all()
        diff = np.abs((truth.dx_hi[k] - oracle.dx_hi[k]) + (truth.dx_lo[k] - oracle.dx_lo[k]))
        assert (diff <= bounds.CERTIFY_ULP * ulp[k]
                + np.abs(oracle.dx_hi[k]) * 2.0 ** -(ORACLE_BITS - 2)).all(), (
            fn.name, fmt.name, params, x[k], g[k])
    if params_ok and (oracle.kind != "nan").all():
        uw, tiny, _ = work_format(fmt)
        for j in range(len(fn.params)):
            want = math.fsum([*oracle.dp_hi[:, j], *oracle.dp_lo[:, j]])
            got = math.fsum([*truth.dp_hi[:, j], *truth.dp_lo[:, j]])
            assert abs(got - want) <= bounds.CERTIFY_ULP * uw * max(abs(want), tiny)


@st.composite
def repeating_input(draw, functions: list[str]):
    """Rows long enough to be evaluated per distinct value (numerics/certified/row_blocks.py): a few
    values of a generator, with threshold values among them (+-0, inf, NaN, huge...), each
    repeated at random places; a value may be the row's maximum many times over."""
    fn, fmt, palette, params = draw(drawn_input(functions))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    n = draw(st.sampled_from([row_blocks.FROM, row_blocks.FROM + 1, 3 * row_blocks.FROM + 5]))
    k = draw(st.integers(1, 48))  # distinct values at most, per row
    pick = rng.integers(0, min(k, palette.shape[1]), (palette.shape[0], n))
    x = np.take_along_axis(palette, pick, axis=1)
    assert all(row_blocks.distinct(row) is not None for row in x)  # the path under test
    return fn, fmt, x, params


LONG_EXAMPLES = max(8, min(40, ELEMENTS // 25_000))


@settings(PROPERTY, max_examples=LONG_EXAMPLES)
@given(repeating_input(list(FUNCTION_NAMES)))
def test_rows_of_repeated_values_hold_against_mpmath(case):
    _forward_holds(*case)


@settings(PROPERTY, max_examples=LONG_EXAMPLES)
@given(repeating_input(GRADIENT_FUNCTIONS), st.integers(0, 2**31))
def test_gradients_on_repeated_values_hold_against_mpmath(case, seed):
    _gradients_hold(*case, seed)


def test_a_row_by_its_distinct_values_matches_it_element_by_element(monkeypatch):
    """The same rows certified, the same special structure and values within both claims
    (2^-12 ulp each), whether a long row that repeats is evaluated per distinct value or
    per element (row_blocks.FROM out of reach)."""
    rng = np.random.default_rng(5)
    x = np.round(rng.standard_normal((3, 20000)) * 16) / 16
    x[1, [5, 90]] = np.inf
    x[2, 7] = np.nan
    x[0, 11:40] = -0.0
    g = rng.standard_normal(x.shape)
    rows = np.arange(3)
    for f in FUNCTION_NAMES:
        fn = get_function(f)
        params = fn.param_grid()[-1]
        for dtype in ("fp32", "bf16"):
            fmt = get_format(dtype)
            with np.errstate(all="ignore"):
                fast = certified.forward_truth(fn, params, x, rows, fmt)
                grad = (certified_grad.gradient_truth(fn, params, x, g, rows, fmt)
                        if fn.gradient_row is not None else None)
                monkeypatch.setattr(row_blocks, "FROM", 1 << 40)
                slow = certified.forward_truth(fn, params, x, rows, fmt)
                grad_slow = (certified_grad.gradient_truth(fn, params, x, g, rows, fmt)
                             if grad is not None else None)
                monkeypatch.undo()
            assert (fast[1] == slow[1]).all() and fast[1].all()
            a, b = fast[0], slow[0]
            assert (a.kind == b.kind).all() and (a.zero == b.zero).all()
            _within_both_claims(a.hi, a.lo, b.hi, b.lo, fmt)
            if grad is not None:
                assert (grad[1] == grad_slow[1]).all() and grad[2] == grad_slow[2]
                a, b = grad[0], grad_slow[0]
                assert (a.dzero == b.dzero).all()
                _within_both_claims(a.dx_hi, a.dx_lo, b.dx_hi, b.dx_lo, fmt)


def test_outputs_near_float64s_bottom_are_certified_as_stored():
    # fp64 Elastic-Softmax at tau = 1/256: outputs from 2^-940 down past 2^-1100 (0), the
    # subnormals among them, certified without mpmath (tiny_values) and equal to the oracle's
    # stored value; before, every such row went to mpmath
    fn, fmt = get_function("elastic"), get_format("fp64")
    rng = np.random.default_rng(3)
    x = np.concatenate([np.full((3, 1), 3.0), 3.0 - rng.uniform(2.5, 3.0, (3, 300))], axis=1)
    params = {"tau": 1 / 256, "beta": 0.5}
    out = certified.forward(fn, params, x)
    assert certified.certified_rows(out, fmt).all()
    assert out.rounded.sum() > 500 and (out.hi[out.rounded] < 2.0**-1022).any()
    oracle = evaluate_rows(fn.name, params, x, np.arange(3), ORACLE_BITS, sides=False)
    assert (out.hi + out.lo == oracle.hi + oracle.lo)[out.rounded].all()
    _forward_holds(fn, fmt, x, params)


def _within_both_claims(ah, al, bh, bl, fmt) -> None:
    finite = np.isfinite(bh)
    assert (np.isnan(ah) == np.isnan(bh)).all()
    ulp = ulp_of(bh[finite], bl[finite], fmt)
    diff = np.abs((ah[finite] - bh[finite]) + (al[finite] - bl[finite]))
    assert (diff <= 2 * bounds.CERTIFY_ULP * ulp).all()


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_the_default_matrix_is_nearly_all_certified(dtype):
    """What makes the reference fast: on the verify matrix's inputs, mpmath is left with a
    small share (the fp64 underflow band, single-element rows, overflowing sums)."""
    total = fallback = 0
    for name in ("normal", "uniform", "dominant", "ties_max", "relu_zeros", "flat"):
        x = generate(name, dtype, (4, 1000), 7).astype(np.float64)
        for f in FUNCTION_NAMES:
            fn = get_function(f)
            for params in fn.param_grid()[:4]:
                with np.errstate(all="ignore"):
                    out = certified.forward(fn, params, x)
                ok = certified.certified_rows(out, get_format(dtype))
                total += x.size
                fallback += int((~ok).sum()) * x.shape[1]
    assert fallback <= 0.1 * total


def test_the_allocator_keeps_freed_memory_on_glibc():
    """The command line's one allocator setting (docs/numerics.md 6.6) takes on Linux/glibc."""
    import platform
    import sys

    from elasticbench.harness.allocator import keep_freed_memory

    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is glibc


def test_a_verification_gives_back_more_unless_told_otherwise(monkeypatch):
    """verify's processes keep less freed memory (share_memory), through the environment
    its lane inherits; a MALLOC_TRIM_THRESHOLD_ set by the user wins."""
    from elasticbench.harness import allocator

    monkeypatch.delenv(allocator.TRIM_VARIABLE, raising=False)
    assert allocator.trim_threshold() == allocator.TRIM_THRESHOLD
    allocator.share_memory()
    assert allocator.trim_threshold() == allocator.SHARED_TRIM_THRESHOLD < allocator.TRIM_THRESHOLD
    monkeypatch.setenv(allocator.TRIM_VARIABLE, "1048576")
    allocator.share_memory()
    assert allocator.trim_threshold() == 1 << 20
    monkeypatch.setenv(allocator.TRIM_VARIABLE, "lots")
    assert allocator.trim_threshold() == allocator.TRIM_THRESHOLD
    monkeypatch.delenv(allocator.TRIM_VARIABLE)
    allocator.keep_freed_memory()  # leave this process as the suite found it


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_distinct_counts_16_bit_rows_as_the_sort_would(dtype):
    """A row of 16-bit values is grouped by counting its bit patterns (row_blocks._narrow):
    the same values in the same order, the same positions and counts as the sort, with -0,
    +-inf and NaN among them; an fp32 row of thirds, which no 16-bit format holds, is sorted."""
    fmt = get_format(dtype)
    rng = np.random.default_rng(3)
    x = (rng.integers(-300, 300, 3 * row_blocks.FROM) / (3 if dtype == "fp32" else 8))
    x = x.astype(fmt.numpy)
    x[:6] = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, 48.0]).astype(fmt.numpy)
    row = x.astype(np.float64)
    bits = row.view(np.uint64)
    narrowed = [row_blocks._narrow(bits, f) for f in row_blocks.SIXTEEN_BIT]
    assert any(n is not None for n in narrowed) == (dtype != "fp32")
    values, index, counts = row_blocks.distinct(row)
    want = np.unique(bits)
    assert np.array_equal(values.view(np.uint64), want)
    assert np.array_equal(index, np.searchsorted(want, bits))
    assert np.array_equal(counts, np.bincount(np.searchsorted(want, bits)))
    assert np.array_equal(values[index].view(np.uint64), bits)


def _long_gradient_rows(fmt) -> np.ndarray:
    """Rows of three column blocks and a bit (certified_grad.column_blocks), each with its
    single largest logit in a different block, one of them dominant (y_k near 1, where
    g_k - c cancels), one with ties for the maximum and one of all negatives but one."""
    n = 3 * row_blocks.BLOCK + 5
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, n))
    x[0, 2 * row_blocks.BLOCK + 3] = 40.0  # dominant, in the third block
    x[1, 7] = x[1, n - 1] = 6.0  # two tops, first and last block
    x[2] = -np.abs(x[2])
    x[2, row_blocks.BLOCK + 1] = 0.5
    x[3, n - 2] = 5.0
    return fmt.cast(x).astype(np.float64)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_long_rows_stream_through_column_blocks_as_one_block_would(dtype, monkeypatch):
    """The backward's long rows go through column blocks (row sums as trees of block sums):
    the same rows certified, the same structure and dx within both claims as with the whole
    row one block."""
    fmt = get_format(dtype)
    x = _long_gradient_rows(fmt)
    g = fmt.cast(np.random.default_rng(2).standard_normal(x.shape)).astype(np.float64)
    rows = np.arange(x.shape[0])
    for f in GRADIENT_FUNCTIONS:
        fn = get_function(f)
        params = fn.param_grid()[-1]
        with np.errstate(all="ignore"):
            blocked = certified_grad.gradient_truth(fn, params, x, g, rows, fmt)
            monkeypatch.setattr(certified_grad, "BLOCK", 1 << 40)
            whole = certified_grad.gradient_truth(fn, params, x, g, rows, fmt)
            monkeypatch.undo()
        assert blocked[1].all() and (blocked[1] == whole[1]).all() and blocked[2] == whole[2]
        a, b = blocked[0], whole[0]
        assert (a.dzero == b.dzero).all()
        _within_both_claims(a.dx_hi, a.dx_lo, b.dx_hi, b.dx_lo, fmt)
        uw, tiny, _ = work_format(fmt)
        for j in range(a.dp_hi.shape[1]):
            got = math.fsum([*a.dp_hi[:, j], *a.dp_lo[:, j]])
            want = math.fsum([*b.dp_hi[:, j], *b.dp_lo[:, j]])
            assert abs(got - want) <= 2 * bounds.CERTIFY_ULP * uw * max(abs(want), tiny)


def test_long_rows_in_column_blocks_hold_against_mpmath():
    """The blocked backward against the oracle on long rows with a single top in a later
    block (the dominant-difference form applied there) and ties; with 10^6 elements asked
    for (CI), the masked stretches and a top in the last block too."""
    fmt = get_format("fp32")
    x = _long_gradient_rows(fmt)[: 4 if ELEMENTS >= 10**6 else 2]
    for f in GRADIENT_FUNCTIONS:
        fn = get_function(f)
        _gradients_hold(fn, fmt, x, fn.param_grid()[-1], 5)


@pytest.mark.parametrize("m", [1, 7, 300, 2000])
@pytest.mark.parametrize("seen", [1, 64, 2048])
def test_hashed_grouping_matches_the_sort(m, seen):
    """row_blocks._hashed (a hash table, a sort of the values that lost their slot) groups a
    row exactly as the sort does, whatever the sample's estimate of its distinct values; 300
    values in the 1024 slots of seen=1 collide, so the losers' path is taken."""
    rng = np.random.default_rng(m)
    palette = rng.standard_normal(m).astype(np.float32).astype(np.float64)
    palette[: min(m, 4)] = [-0.0, 0.0, np.inf, np.nan][: min(m, 4)]
    bits = palette[rng.integers(0, m, 3 * row_blocks.FROM)].view(np.uint64)
    got = row_blocks._hashed(bits, seen)
    if got is None:  # too many lost their slot: the caller sorts
        assert m > 1024
        return
    want = row_blocks._sorted(bits)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    if m == 300 and seen == 1:
        slots = (np.unique(palette.view(np.uint64)) * row_blocks.GOLDEN) >> np.uint64(54)
        assert np.unique(slots).size < np.unique(palette.view(np.uint64)).size


def test_long_16_bit_rows_are_counted_however_varied():
    """A long fp16 row of many distinct values (its sample looks unrepeated) is still grouped
    by its bit patterns: at most 65536 values for any length."""
    rng = np.random.default_rng(1)
    row = rng.normal(0, 3, 1 << 18).astype(np.float16).astype(np.float64)
    values, index, counts = row_blocks.distinct(row)
    assert values.size < 65536 and counts.sum() == row.size
    assert np.array_equal(values[index].view(np.uint64), row.view(np.uint64))
