"""ulp arithmetic against values worked out by hand."""

import numpy as np
import pytest

from elasticbench.harness.numerics.dtypes import FORMATS, get_format
from elasticbench.harness.numerics.ulp import ulp_error, ulp_of


def test_ulp_of_one_in_each_format():
    for name, fmt in FORMATS.items():
        assert ulp_of(np.array([1.0]), np.array([0.0]), fmt)[0] == 2.0 ** (1 - fmt.p), name


def test_ulp_just_below_a_power_of_two_uses_the_lower_binade():
    fmt = get_format("fp32")
    # 1 - 2^-60 is stored as hi = 1.0, lo = -2^-60: its binade is [0.5, 1).
    assert ulp_of(np.array([1.0]), np.array([-(2.0**-60)]), fmt)[0] == 2.0**-24


def test_ulp_is_constant_below_the_normal_range():
    fmt = get_format("fp16")
    tiny = np.array([2.0**-20, 0.0])
    assert np.all(ulp_of(tiny, np.zeros(2), fmt) == 2.0**-24)


@pytest.mark.parametrize("dtype", ["fp64", "fp32", "fp16", "bf16"])
def test_error_counts_whole_ulps(dtype):
    fmt = get_format(dtype)
    y = np.array([0.75])
    one_up = np.nextafter(fmt.cast(y), np.array(np.inf, dtype=fmt.numpy))
    assert ulp_error(fmt.cast(y), y, np.zeros(1), fmt)[0] == 0
    assert ulp_error(one_up, y, np.zeros(1), fmt)[0] == pytest.approx(1.0)


def test_error_sees_the_low_word_of_the_reference():
    fmt = get_format("fp64")
    third_hi = 1 / 3
    # the exact third is hi + lo; returning hi costs |lo| / ulp, about a third of an ulp
    lo = -(third_hi - 1 / 3) + 1.850371707708594e-17
    err = ulp_error(np.array([third_hi]), np.array([third_hi]), np.array([lo]), fmt)[0]
    assert err == pytest.approx(abs(lo) / 2.0**-54)


def test_nan_and_inf_outputs():
    fmt = get_format("fp32")
    err = ulp_error(np.array([np.nan, np.inf]), np.array([0.5, 0.5]), np.zeros(2), fmt)
    assert np.isnan(err[0]) and np.isinf(err[1])
