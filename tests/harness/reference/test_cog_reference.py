"""Cog's exact reference (functions/cog.py) and the attention truth built on it, against
mpmath at 256 bits: the weights against the formula written out, the gradient against
central differences of the definition, the special values of docs/attention.md section 9,
and the attention truth (128 bits) against the oracle at 256 bits on drawn inputs."""

from __future__ import annotations

import math

import mpmath
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elasticbench.harness.functions import cog, get_attention_function
from elasticbench.harness.functions.definition import ROW_FINITE, ROW_INF, ROW_MASKED, ROW_NAN
from elasticbench.harness.kinds.attention.qkv_inputs import generate_qkv
from elasticbench.harness.numerics.truth import attention_truth as at

PROPERTY = settings(deadline=None, derandomize=True, database=None, max_examples=40,
                    suppress_health_check=list(HealthCheck))
BITS = 256
FN = get_attention_function("cog_attention")

scores = st.lists(st.one_of(st.floats(-40, 40), st.sampled_from([0.0, -0.0, 1.5, -1.5])),
                  min_size=1, max_size=9)


def _formula(row: list[float]) -> list:
    """sign(s) exp(|s|) / sum exp(|s|), as written (no shift: mpmath's range is unbounded)."""
    e = [mpmath.exp(abs(mpmath.mpf(x))) for x in row]
    den = mpmath.fsum(e)
    return [mpmath.sign(x) * ei / den for x, ei in zip(row, e, strict=True)]


@PROPERTY
@given(scores)
def test_weights_are_the_formula_signed_and_sum_to_one_in_magnitude(row):
    with mpmath.workprec(BITS):
        t = cog.reference(row)
        want = _formula(row)
        assert t.kind == ROW_FINITE
        for y, w in zip(t.y, want, strict=True):
            assert abs(y - w) <= mpmath.mpf(2) ** -(BITS - 8) * (abs(w) + 2.0**-300)
        nonzero = [x != 0 for x in row]
        assert [y == 0 for y in t.y] == [not nz for nz in nonzero] == t.zero
        assert all(mpmath.sign(y) == mpmath.sign(x) for y, x in zip(t.y, row, strict=True))
        if all(nonzero):
            assert abs(mpmath.fsum(abs(y) for y in t.y) - 1) < mpmath.mpf(2) ** -(BITS - 8)


def _out(row: list, g: list) -> mpmath.mpf:
    return mpmath.fsum(y * gi for y, gi in zip(_formula(row), g, strict=True))


@PROPERTY
@given(st.lists(st.floats(-6, 6).filter(lambda x: abs(x) > 1e-3), min_size=1, max_size=7),
       st.data())
def test_gradient_is_the_derivative_of_the_definition(row, data):
    g = data.draw(st.lists(st.floats(-4, 4), min_size=len(row), max_size=len(row)))
    with mpmath.workprec(BITS):
        rg = cog.gradient(row, g)
        h = mpmath.mpf(2) ** -90
        for k in range(len(row)):
            up, down = list(map(mpmath.mpf, row)), list(map(mpmath.mpf, row))
            up[k] += h
            down[k] -= h
            fd = (_out(up, g) - _out(down, g)) / (2 * h)
            assert abs(rg.dx[k] - fd) <= mpmath.mpf(2) ** -120 * (1 + abs(fd))


def test_a_zero_score_weighs_zero_but_counts_in_the_denominator_and_has_gradient_p_g():
    with mpmath.workprec(BITS):
        t = cog.reference([0.0, 2.0, -2.0])
        e2 = mpmath.exp(2)
        den = 1 + 2 * e2
        tol = mpmath.mpf(2) ** -(BITS - 8)
        assert t.y[0] == 0 and abs(t.y[1] - e2 / den) < tol and abs(t.y[2] + e2 / den) < tol
        rg = cog.gradient([0.0, 2.0, -2.0], [3.0, 0.0, 0.0])
        # the mean of the two one-sided derivatives at 0: p g, with p = 1/den
        assert abs(rg.dx[0] - 3 / den) < mpmath.mpf(2) ** -(BITS - 8)
        # dx_k = p_k g_k - y_k c, c = y_0 g_0 = 0: the others do not move
        assert rg.dx[1] == 0 and rg.dx[2] == 0


def test_special_values_are_the_limits_the_policy_names():
    inf = math.inf
    t = cog.reference([inf, -inf, 1.0, inf])
    assert t.kind == ROW_INF
    assert [float(y) for y in t.y] == [1 / 3, -1 / 3, 0.0, 1 / 3]
    assert cog.gradient([inf, 2.0], [1.0, 1.0]).dx == [0, 0]
    assert cog.reference([1.0, math.nan]).kind == ROW_NAN
    assert cog.gradient([1.0, math.nan], [1.0, 1.0]).dx == [None, None]
    assert cog.reference([]).kind == ROW_MASKED


@settings(deadline=None, derandomize=True, database=None, max_examples=12,
          suppress_health_check=list(HealthCheck))
@given(st.sampled_from(["normal", "straddle_zero", "abs_ties", "zero_scores", "all_negative",
                        "inf_scores", "nan_v"]),
       st.sampled_from(["fp64", "fp32", "bf16"]), st.booleans(), st.integers(0, 2**16))
def test_attention_truth_agrees_with_the_oracle_at_256_bits(gen, dtype, causal, seed):
    shape = (1, 2, 5, 6, 3)
    q, k, v = (a.astype(np.float64) for a in generate_qkv(gen, dtype, shape, seed))
    dout = np.random.default_rng(seed).standard_normal((1, 2, 5, 3))
    params = FN.validate_params({"causal": float(causal)})
    scale = 1 / math.sqrt(3)
    got = at.evaluate(FN, params, q, k, v, scale, dout)
    ref = at.oracle_evaluate(FN, params, q, k, v, scale, dout, precision=BITS)
    for name in ("out", "dq", "dk", "dv"):
        gh, gl = getattr(got, f"{name}_hi"), getattr(got, f"{name}_lo")
        rh, rl = getattr(ref, f"{name}_hi"), getattr(ref, f"{name}_lo")
        np.testing.assert_array_equal(np.isnan(gh), np.isnan(rh))
        fin = ~np.isnan(rh)
        err = np.abs((gh[fin] - rh[fin]) + (gl[fin] - rl[fin]))
        assert (err <= 2.0**-100 * np.maximum(np.abs(rh[fin]), 2.0**-900)).all(), name
    np.testing.assert_array_equal(got.out_zero, ref.out_zero)
    np.testing.assert_array_equal(got.dzero_q, ref.dzero_q)
    np.testing.assert_array_equal(got.w, ref.w)
