"""The exact reference against closed forms, the unshifted definition, and itself at two
precisions; the special-value policy of docs/definitions.md section 3."""

import math

import mpmath
import numpy as np
import pytest

from elasticbench.harness.functions import FUNCTIONS, get_function
from elasticbench.harness.numerics.truth.row_truth import evaluate_rows


def exact(function, row, precision=128, **params):
    """The truth of one row as float64 values (hi + lo)."""
    t = evaluate_rows(function, params, np.array([row], dtype=np.float64), np.arange(1),
                      precision)
    return t.hi[0] + t.lo[0], t


@pytest.mark.parametrize(
    ("function", "row", "params", "expected"),
    [
        ("softmax", [0.0, 0.0, 0.0, 0.0], {}, [0.25] * 4),
        ("softmax", [5.0, 5.0], {}, [0.5, 0.5]),
        ("softmax1", [0.0], {}, [0.5]),
        ("softmax1", [-math.inf, -math.inf], {}, [0.0, 0.0]),
        ("stablemax", [0.0, 1.0], {}, [1 / 3, 2 / 3]),
        ("stablemax", [-1.0, 0.0], {}, [1 / 3, 2 / 3]),
        ("symax", [1.0, -3.0], {"eta": 0.0}, [0.25, 0.75]),
        ("symax", [1.0, -3.0], {"eta": 4.0}, [0.125, 0.375]),
        # equal kept logits c: 1 / (k + beta exp(-c/tau)); c = 0 makes it 1 / (k + beta)
        ("elastic", [0.0, -0.0, -1.0, 0.0], {"tau": 1.0, "beta": 1.0}, [0.25, 0.25, 0.0, 0.25]),
        ("elastic", [0.0, 0.0], {"tau": 0.01, "beta": 0.0}, [0.5, 0.5]),
    ],
)
def test_closed_forms(function, row, params, expected):
    y, _ = exact(function, row, **params)
    np.testing.assert_allclose(y, expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("tau", [0.01, 1.0, 10.0])
@pytest.mark.parametrize("beta", [0.0, 1e-10, 1.0, 100.0])
def test_elastic_equals_the_unshifted_definition(tau, beta):
    """The shifted form with the exp(-m/tau) rescaling IS the definition (docs/definitions.md section 1)."""
    rng = np.random.default_rng(7)
    row = np.round(rng.normal(1.0, 2.0, 12), 3).tolist()
    y, _ = exact("elastic", row, tau=tau, beta=beta)
    with mpmath.workprec(400):
        e = [mpmath.exp(mpmath.mpf(v) / tau) if v >= 0 else mpmath.mpf(0) for v in row]
        d = mpmath.fsum(e) + beta
        want = [float(v / d) for v in e]
    np.testing.assert_allclose(y, want, rtol=1e-15, atol=0)
    kept = mpmath.fsum(e)
    assert math.isclose(sum(y), float(kept / (kept + beta)), rel_tol=1e-14)


def test_softmax1_equals_the_unshifted_definition():
    row = [3.5, -2.0, 0.25, 7.0]
    y, _ = exact("softmax1", row)
    with mpmath.workprec(300):
        e = [mpmath.exp(v) for v in row]
        want = [float(v / (1 + mpmath.fsum(e))) for v in e]
    np.testing.assert_allclose(y, want, rtol=1e-15)


@pytest.mark.parametrize("function", list(FUNCTIONS))
def test_two_precisions_agree(function):
    fn = get_function(function)
    params = fn.defaults()
    row = np.random.default_rng(3).normal(0, 3, 64)
    _, t1 = exact(function, row.tolist(), 128, **params)
    _, t2 = exact(function, row.tolist(), 256, **params)
    assert np.array_equal(t1.hi, t2.hi)
    np.testing.assert_allclose(t1.lo, t2.lo, rtol=1e-12, atol=1e-300)


def test_precision_below_128_bits_is_refused():
    with pytest.raises(ValueError, match="at least 128"):
        exact("softmax", [1.0], precision=64)


@pytest.mark.parametrize("function", list(FUNCTIONS))
def test_nan_makes_the_whole_row_nan(function):
    params = get_function(function).defaults()
    y, t = exact(function, [1.0, math.nan, 2.0], **params)
    assert np.isnan(y).all() and t.kind[0] == "nan"


@pytest.mark.parametrize("function", list(FUNCTIONS))
def test_plus_inf_shares_the_row(function):
    params = get_function(function).defaults()
    y, t = exact(function, [math.inf, 1.0, math.inf, 0.5], **params)
    assert y.tolist() == [0.5, 0.0, 0.5, 0.0] and t.kind[0] == "inf"
    assert t.zero[0].tolist() == [False, True, False, True]


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_elastic_fully_masked_rows_are_zero(beta):
    y, t = exact("elastic", [-1.0, -math.inf, -5e-300], tau=1.0, beta=beta)
    assert y.tolist() == [0.0, 0.0, 0.0] and t.zero.all()


def test_elastic_keeps_both_zeros_and_masks_negatives_exactly():
    y, t = exact("elastic", [-0.0, 0.0, -1e-30, 1.0], tau=1.0, beta=0.0)
    assert y[2] == 0.0 and t.zero[0].tolist() == [False, False, True, False]
    e = math.e
    np.testing.assert_allclose(y, [1 / (2 + e), 1 / (2 + e), 0.0, e / (2 + e)], rtol=1e-15)


def test_softmax_all_minus_inf_is_zero_not_nan():
    y, t = exact("softmax", [-math.inf] * 3)
    assert y.tolist() == [0.0, 0.0, 0.0] and t.kind[0] == "masked"


def test_budget_inputs_zbar_is_the_output_weighted_mean_of_z():
    _, t = exact("softmax", [0.0, -1.0])
    w = [1.0, math.exp(-1.0)]
    assert t.zabs[0].tolist() == [0.0, 1.0]
    assert t.zbar[0] == pytest.approx(w[1] / sum(w))


@pytest.mark.parametrize(("name", "value"), [("tau", 0.0), ("tau", -1.0), ("tau", math.nan),
                                             ("beta", -1e-9), ("beta", math.inf)])
def test_elastic_parameters_are_validated(name, value):
    with pytest.raises(ValueError, match=name):
        get_function("elastic").validate_params({name: value})


def test_symax_eta_is_validated_and_unknown_params_refused():
    with pytest.raises(ValueError, match="eta"):
        get_function("symax").validate_params({"eta": -1})
    with pytest.raises(ValueError, match="no parameter"):
        get_function("softmax").validate_params({"tau": 1})


@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
def test_outputs_next_to_a_power_of_two_are_placed_on_their_side(dtype):
    """A row of subnormal logits of a power-of-two length has every output 1/n within a
    relative 10^-38 (fp32) or 10^-320 (fp64), and the side of 1/n decides the binade (the
    ulp) an error is scored in: the truth is evaluated again at more bits, so that its tail
    has the sign of y - 1/n, which for logits this small is the sign of n x_i - sum x (exact
    in rationals); in fp64 that tail is below float64's range and is kept as +-2^-1074.
    (Evaluated with an upstream gradient: the outputs of a backward's truth.)"""
    from fractions import Fraction

    from elasticbench.harness.inputs.generators import generate
    from elasticbench.harness.numerics.dtypes import get_format
    from elasticbench.harness.numerics.ulp import binade

    x = generate("subnormal", dtype, (1, 256), 4).astype(np.float64)
    total = sum(Fraction(v) for v in x[0])
    side = np.array([np.sign(float(256 * Fraction(v) - total)) for v in x[0]])
    assert (side < 0).sum() > 50 and (side > 0).sum() > 50
    g = get_format(dtype).cast(np.random.default_rng(1).standard_normal(x.shape))
    t = evaluate_rows("softmax", {}, x, np.arange(1), 128, g.astype(np.float64))
    assert (t.hi == 2.0**-8).all()
    known = side != 0
    assert np.array_equal(np.sign(t.lo[0][known]), side[known])
    assert np.array_equal(binade(t.hi, t.lo)[0][known], np.where(side[known] < 0, -9, -8))
