"""certify's cheap test (bounds._clear) only ever says yes where the full test does: the two
give the same answer on values near powers of two, subnormals, zeros, non-finite values and
bounds on both sides of the certification threshold, in every format."""

from __future__ import annotations

import numpy as np
import pytest

from elasticbench.harness.numerics.certified.bounds import (
    CERTIFY_ULP,
    PIECE,
    _certify_each,
    _clear,
    certify,
)
from elasticbench.harness.numerics.dtypes import get_format

N = 120_000


def _values(rng: np.random.Generator, name: str):
    fmt = get_format(name)
    e = rng.integers(-1074, 60, N).astype(np.int32)
    sign = np.where(rng.random(N) < 0.5, -1.0, 1.0)
    hi = sign * np.ldexp(1.0, e) * np.where(rng.random(N) < 0.3, 1.0, 1 + rng.random(N))
    near = rng.random(N) < 0.25  # within 2^-20 .. 2^-60 of a power of two, either side
    step = np.ldexp(rng.standard_normal(near.sum()), -rng.integers(20, 60, near.sum()))
    hi[near] = sign[near] * np.ldexp(1.0, e[near]) * (1 + step)
    for share, value in ((0.05, 0.0), (0.01, np.inf), (0.01, np.nan)):
        hi[rng.random(N) < share] = value
    lo = np.nan_to_num(hi * np.ldexp(rng.standard_normal(N), -54 - rng.integers(0, 10, N)))
    binade = np.maximum(np.frexp(np.abs(np.nan_to_num(hi)))[1] - 1, fmt.emin)
    ulp = np.ldexp(1.0, (binade - fmt.p + 1).astype(np.int32))
    # bounds from 2^-30 to 4 times the threshold, some exact
    bound = ulp * CERTIFY_ULP * np.ldexp(rng.random(N), rng.integers(-30, 3, N).astype(np.int32))
    bound[rng.random(N) < 0.05] = 0.0
    bound[rng.random(N) < 0.01] = np.inf
    return fmt, hi, lo, bound, rng.random(N) < 0.1, rng.random(N) < 0.05


@pytest.mark.parametrize("name", ["fp64", "fp32", "fp16", "bf16"])
def test_cheap_test_agrees_with_the_full_one(name: str) -> None:
    fmt, hi, lo, bound, sided, rounded = _values(np.random.default_rng(7), name)
    full = _certify_each(hi, lo, bound, fmt, sided, rounded)
    assert 0.3 < full.mean() < 0.95  # both answers occur often
    assert not (_clear(hi, lo, bound, fmt) & ~full).any()  # never yes where the full says no
    shape = (4, N // 4)  # rows, and more than one PIECE in all
    assert N > PIECE
    got = certify(*(a.reshape(shape) for a in (hi, lo, bound)), fmt,
                  sided.reshape(shape), rounded.reshape(shape))
    np.testing.assert_array_equal(got.ravel(), full)
    np.testing.assert_array_equal(certify(hi, lo, bound, fmt), _certify_each(
        hi, lo, bound, fmt, False, False))
