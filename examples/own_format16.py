"""16-bit kernels that compute in their own format, judged by the `own` accuracy contract.

    elasticbench verify --kernel-file examples/own_format16.py -d fp16,bf16

Every step of `own16_elastic` and `own16_softmax1` rounds to the input's format (fp16 or
bf16): the shift x - m, the division by tau, the exponential, a pairwise sum and the final
division, as code written in 16-bit arithmetic does. They declare `accuracy="own"`, so they
are judged by budgets derived for that arithmetic (docs/numerics.md section 3.1) and pass
the default matrix; under the default contract (a 16-bit kernel computes in fp32 and rounds
once) they would fail by a few ulps. The three variants below keep one classic bug each
and fail under the `own` contract too: no contract hides them.

One care a 16-bit kernel needs: fp16's largest number is 65504, so a row sum over more
columns (or a large beta) would overflow. The partial sums of 2^14 terms (each term is at
most 1) are scaled by a power of two chosen from n and beta before they are added up,
and the quotient is scaled back: scaling by a power of two is exact in the normal range.
"""

from __future__ import annotations

import math

import numpy as np

from elasticbench import register_kernel

FORMATS = ("fp16", "bf16")
UNSCALED_LEVELS = 14  # pairwise levels summed unscaled: partial sums stay below 2^14
CLAMP = 10.0  # the clamping variant's bound on the logits


def _pairwise(a: np.ndarray, levels: int | None = None) -> np.ndarray:
    """Rows of a summed pairwise (each addition rounded to a's format), `levels` levels
    deep (all of them by default): the columns left."""
    while a.shape[1] > 1 and (levels is None or levels > 0):
        if a.shape[1] % 2:
            a = np.concatenate([a, np.zeros((a.shape[0], 1), a.dtype)], axis=1)
        a = a[:, 0::2] + a[:, 1::2]
        levels = None if levels is None else levels - 1
    return a


def _exponent_room(dtype: np.dtype, n: int, beta: float) -> int:
    """k such that a sum of n terms at most 1, plus beta, times 2^-k stays finite."""
    emax = 15 if dtype == np.float16 else 127  # bf16 has fp32's range
    return max(0, math.ceil(math.log2(n + beta + 1)) - emax)


def _special_rows(x: np.ndarray, keep: np.ndarray, y: np.ndarray) -> None:
    """The policy (docs/definitions.md section 3) on rows with a NaN or a kept +inf."""
    inf = keep & (x == np.inf)
    rows = inf.any(axis=1)
    share = inf[rows] / inf[rows].sum(axis=1, keepdims=True)
    y[rows] = share.astype(y.dtype)
    y[np.isnan(x).any(axis=1)] = np.nan


def exp_normalize16(x: np.ndarray, tau: float, beta: float, *, keep_all: bool,
                    shift: bool = True, rescale: bool = True, clamp: bool = False
                    ) -> np.ndarray:
    """exp((x - m)/tau) / (sum + beta exp(-m/tau)) with every step in x's format; keep_all
    False masks negative logits (elastic), True keeps them (softmax1: tau = beta = 1)."""
    t = x.dtype.type
    with np.errstate(invalid="ignore"):
        keep = (x > -np.inf) if keep_all else (x >= 0)
    if clamp:  # the bug: a "safety" clamp that changes every logit beyond it
        x = np.clip(x, t(-CLAMP), t(CLAMP)).astype(t)
    kept = np.where(keep & np.isfinite(x), x, t(-np.inf))
    m = np.maximum(kept.max(axis=1, keepdims=True), t(0)) if shift else np.zeros_like(x[:, :1])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        e = np.where(keep & np.isfinite(x), np.exp((x - m) / t(tau)), t(0))
        k = _exponent_room(x.dtype, x.shape[1], beta)
        parts = _pairwise(e, UNSCALED_LEVELS) * t(2.0**-k)
        offset = np.exp(-m / t(tau)) if rescale else np.ones_like(m)
        den = _pairwise(parts) + t(beta * 2.0**-k) * offset
        y = np.where(den > 0, e / np.where(den > 0, den, t(1)), t(0)) * t(2.0**-k)
    y = y.astype(x.dtype)
    _special_rows(x, keep, y)
    return y


@register_kernel(function="elastic", backend="numpy", dtypes=FORMATS, accuracy="own")
def own16_elastic(x, *, tau, beta):
    """Elastic-Softmax with every step in fp16/bf16."""
    return exp_normalize16(x, tau, beta, keep_all=False)


@register_kernel(function="softmax1", backend="numpy", dtypes=FORMATS, accuracy="own")
def own16_softmax1(x):
    """softmax1 ("+1" in the denominator, rescaled by exp(-m)) in fp16/bf16."""
    return exp_normalize16(x, 1.0, 1.0, keep_all=True)


@register_kernel(function="softmax1", backend="numpy", dtypes=FORMATS, accuracy="own")
def own16_one_not_rescaled(x):
    """Bug: the "+1" added after the shift without exp(-m)."""
    return exp_normalize16(x, 1.0, 1.0, keep_all=True, rescale=False)


@register_kernel(function="elastic", backend="numpy", dtypes=FORMATS, accuracy="own")
def own16_no_max_shift(x, *, tau, beta):
    """Bug: exp(x/tau) without the max shift (overflows on large logits)."""
    return exp_normalize16(x, tau, beta, keep_all=False, shift=False)


@register_kernel(function="elastic", backend="numpy", dtypes=FORMATS, accuracy="own")
def own16_clamped(x, *, tau, beta):
    """Bug: logits clamped to [-10, 10] before the exponential."""
    return exp_normalize16(x, tau, beta, keep_all=False, clamp=True)
