"""Adversarial input generators. Each is named, seeded and reproducible.

A generator draws float64 values with a seeded NumPy Generator; `generate` rounds them
to the target format, so every input value is exactly representable there (and converts
exactly to mpmath). The seed stream of an input depends on (seed, generator, dtype, shape)
only, so adding a case never changes another case's data.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from elasticbench.harness.numerics.dtypes import FloatFormat, get_format

Draw = Callable[[np.random.Generator, FloatFormat, int, int], np.ndarray]


@dataclass(frozen=True)
class Generator:
    name: str
    summary: str
    draw: Draw  # (rng, format, rows, n) -> float64 array of shape (rows, n)


GENERATORS: dict[str, Generator] = {}


def _generator(name: str, summary: str) -> Callable[[Draw], Draw]:
    def deco(fn: Draw) -> Draw:
        GENERATORS[name] = Generator(name, summary, fn)
        return fn

    return deco


def _random_positions(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    return rng.integers(0, n, size=rows)


@_generator("normal", "standard normal N(0, 1)")
def _normal(rng, fmt, rows, n):
    return rng.standard_normal((rows, n))


@_generator("uniform", "uniform on [-8, 8)")
def _uniform(rng, fmt, rows, n):
    return rng.uniform(-8.0, 8.0, (rows, n))


@_generator("all_negative", "every logit negative, some -inf (elastic masks the whole row)")
def _all_negative(rng, fmt, rows, n):
    x = -np.exp(rng.uniform(-6.0, 4.0, (rows, n)))
    x[rng.random((rows, n)) < 0.1] = -np.inf
    return x


@_generator("all_zero", "every logit exactly zero, +0.0 and -0.0 mixed")
def _all_zero(rng, fmt, rows, n):
    return np.where(rng.random((rows, n)) < 0.5, 0.0, -0.0)


@_generator("relu_zeros", "sparse exact zeros (both signs) among negatives, ReLU-like")
def _relu_zeros(rng, fmt, rows, n):
    x = -np.abs(rng.standard_normal((rows, n))) - 2.0**-8
    zeros = rng.random((rows, n)) < 0.1
    x[zeros] = np.where(rng.random(zeros.sum()) < 0.5, 0.0, -0.0)
    return x


@_generator("single_nonneg", "exactly one non-negative logit per row, the rest negative")
def _single_nonneg(rng, fmt, rows, n):
    x = -np.abs(rng.standard_normal((rows, n))) - 2.0**-8
    x[np.arange(rows), _random_positions(rng, rows, n)] = np.abs(rng.standard_normal(rows))
    return x


@_generator("huge", "logits near the format's largest finite value, a few of them negative")
def _huge(rng, fmt, rows, n):
    x = fmt.max * rng.uniform(0.5, 1.0, (rows, n))
    return np.where(rng.random((rows, n)) < 0.1, -x, x)


@_generator("near_exp_limit", "logits just below ln(max): exp overflows without the shift")
def _near_exp_limit(rng, fmt, rows, n):
    # the top value is rounded down so that exp of every logit is still finite in the format
    return fmt.round_down(fmt.ln_max) - rng.uniform(0.0, 4.0, (rows, n))


@_generator("ties_equal", "every logit in a row equal (a positive value)")
def _ties_equal(rng, fmt, rows, n):
    return np.repeat(np.abs(rng.standard_normal((rows, 1))) + 0.5, n, axis=1)


@_generator("ties_max", "several logits share the row maximum, the rest below it")
def _ties_max(rng, fmt, rows, n):
    x = rng.uniform(0.0, 2.0, (rows, n))
    for r in range(rows):
        k = min(n, int(rng.integers(2, 6)))
        x[r, rng.choice(n, size=k, replace=False)] = 3.0
    return x


@_generator("dominant", "one dominant logit over a long tail of small positive ones")
def _dominant(rng, fmt, rows, n):
    x = rng.uniform(0.0, 1.0, (rows, n))
    x[np.arange(rows), _random_positions(rng, rows, n)] = min(12.0, 0.9 * fmt.ln_max)
    return x


@_generator("flat", "near-equal small positive logits: row sums grow like n (accumulation)")
def _flat(rng, fmt, rows, n):
    return rng.uniform(0.0, 2.0**-6, (rows, n))


@_generator("coarse", "standard normal rounded to multiples of 1/64: few distinct values, so "
                      "rows of millions stay cheap to verify exactly")
def _coarse(rng, fmt, rows, n):
    return np.round(rng.standard_normal((rows, n)) * 64.0) / 64.0


@_generator("subnormal", "subnormal logits of the format (both signs, some zeros)")
def _subnormal(rng, fmt, rows, n):
    tiny = fmt.min_ulp
    return tiny * rng.integers(-64, 65, (rows, n)).astype(np.float64)


@_generator("specials", "rows with NaN, +inf (one or several), -inf, all -inf, mixed")
def _specials(rng, fmt, rows, n):
    x = np.abs(rng.standard_normal((rows, n)))
    pos = _random_positions(rng, rows, n)
    for r in range(rows):
        i = pos[r]
        j = (i + 1 + n // 2) % n
        pattern = r % 7
        if pattern == 0:
            x[r, i] = np.nan
        elif pattern == 1:
            x[r, i] = np.inf
        elif pattern == 2:
            x[r, i] = np.inf
            x[r, j] = np.inf
        elif pattern == 3:
            x[r, i] = -np.inf
        elif pattern == 4:
            x[r, :] = -np.inf
        elif pattern == 5:
            x[r, i] = np.inf
            x[r, j] = -np.inf
        else:
            x[r, j] = np.nan
            x[r, i] = np.inf
    return x


@_generator("masked_specials", "negative rows (masked by elastic) with a NaN or +inf early and "
            "one positive logit late")
def _masked_specials(rng, fmt, rows, n):
    # A kernel that skips the blocks where nothing is kept yet (an online max) must still
    # see a NaN or +inf there: its sums only start at the late positive logit.
    x = -np.abs(rng.standard_normal((rows, n))) - 0.5
    early = rng.integers(0, max(1, n // 2), rows)
    for r in range(rows):
        pattern = r % 4
        if pattern in (0, 1):
            x[r, early[r]] = np.nan if pattern == 0 else np.inf
        elif pattern == 2:
            x[r, n - 1] = np.nan
        if pattern != 2:
            x[r, n - 1] = abs(x[r, n - 1])
        else:
            x[r, 0] = abs(x[r, 0])
    return x


GENERATOR_NAMES: tuple[str, ...] = tuple(GENERATORS)


def get_generator(name: str) -> Generator:
    try:
        return GENERATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown input {name!r} (choose from {', '.join(GENERATOR_NAMES)})"
        ) from None


def stream_seed(seed: int, name: str, dtype: str, shape: tuple[int, int]) -> list[int]:
    """The entropy for one input: independent of every other case's."""
    return [seed, zlib.crc32(name.encode()), zlib.crc32(dtype.encode()), *shape]


def generate(name: str, dtype: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    """The input `name` of `shape` in format `dtype`, reproducible from `seed`."""
    rows, n = shape
    if rows < 1 or n < 1:
        raise ValueError(f"shape must be at least 1x1, got {rows}x{n}")
    fmt = get_format(dtype)
    rng = np.random.default_rng(stream_seed(seed, name, dtype, shape))
    values = get_generator(name).draw(rng, fmt, rows, n)
    with np.errstate(over="ignore"):
        return fmt.cast(values)
