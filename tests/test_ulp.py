"""ulp arithmetic against values worked out by hand."""

import numpy as np
import pytest

from elasticbench.numerics.dtypes import FORMATS, get_format
from elasticbench.numerics.ulp import ulp_error, ulp_of


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


def test_binades_from_the_bits_are_frexps_and_ldexps():
    """exponent and power_of_two_at give exactly what np.frexp and np.ldexp give, over every
    binade of float64, its subnormals, zero, inf and NaN; ulp_of built on them too."""
    import numpy as np

    from elasticbench.numerics.binade import exponent, power_of_two_at
    from elasticbench.numerics.dtypes import DTYPE_NAMES, get_format
    from elasticbench.numerics.ulp import ulp_of

    rng = np.random.default_rng(7)
    a = np.abs(rng.normal(size=20000)) * 2.0 ** rng.integers(-1080, 1024, 20000).astype(float)
    a = np.concatenate([a, [0.0, 5e-324, 2.0**-1022, np.nextafter(2.0**-1022, 0), np.inf, np.nan,
                            np.finfo(np.float64).max, 1.0, 0.5]])
    with np.errstate(all="ignore"):
        assert (exponent(a) == np.frexp(a)[1] - 1).all()
        k = rng.integers(-1200, 1200, 20000).astype(np.int32)
        assert (power_of_two_at(k).view(np.int64) == np.ldexp(1.0, k).view(np.int64)).all()
        hi = a * np.where(rng.random(a.size) < 0.5, -1.0, 1.0)
        hi[:50] = 2.0 ** rng.integers(-1070, 1000, 50).astype(float)  # powers of two
        lo = hi * 2.0**-60 * rng.uniform(-1, 1, a.size)
        mant, e = np.frexp(hi)
        below = (np.abs(mant) == 0.5) & (lo != 0) & (np.signbit(lo) != np.signbit(hi))
        for name in DTYPE_NAMES:
            fmt = get_format(name)
            b = np.maximum(np.where(hi == 0, fmt.emin, e - 1 - below), fmt.emin)
            want = np.ldexp(1.0, (b - (fmt.p - 1)).astype(np.int32))
            got = ulp_of(hi, lo, fmt)
            same = (got == want) | (np.isnan(got) & np.isnan(want))
            assert same.all(), name
