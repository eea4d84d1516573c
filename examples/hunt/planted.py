"""Elastic-Softmax kernels each right except on one path, for measuring what `hunt` finds
(docs/hunt.md section 5). The default verify matrix catches the first (its NaN rows past
1024 columns) and misses the other three.

    elasticbench hunt --kernel-file examples/hunt/planted.py --budget 480
"""

from __future__ import annotations

import numpy as np

from elasticbench import register_kernel


def _elastic(x: np.ndarray, tau: float, beta: float, *, nan_seen: np.ndarray | None = None,
             drop_last: bool = False) -> np.ndarray:
    """Elastic-Softmax in fp64, rounded once; nan_seen: the rows whose NaN is noticed (all by
    default); drop_last: the last column left out of the sum."""
    x64 = x.astype(np.float64)
    nan_rows = np.isnan(x64).any(axis=1)
    if nan_seen is not None:
        nan_rows &= nan_seen
    kept = x64 >= 0
    s = np.where(kept, x64, -np.inf)
    m = s.max(axis=1, keepdims=True)
    safe_m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(kept, np.exp((s - safe_m) / tau), 0.0)
        total = (e[:, :-1] if drop_last else e).sum(axis=1, keepdims=True)
        den = total + beta * np.exp(-safe_m / tau)
        y = np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)
        big = x64 == np.inf
        share = big / np.maximum(big.sum(axis=1, keepdims=True), 1)
    y = np.where(big.any(axis=1)[:, None], share, y)
    y = np.where(nan_rows[:, None], np.nan, y)
    return y.astype(x.dtype)


@register_kernel(function="elastic", backend="numpy", name="nan_missed_past_1024_columns")
def nan_missed_past_1024_columns(x: np.ndarray, *, tau: float, beta: float) -> np.ndarray:
    """Rows longer than 1024 take a max that skips NaN: their NaN is not propagated."""
    return _elastic(x, tau, beta, nan_seen=np.full(x.shape[0], x.shape[1] <= 1024))


@register_kernel(function="elastic", backend="numpy", name="nan_missed_past_row_1024")
def nan_missed_past_row_1024(x: np.ndarray, *, tau: float, beta: float) -> np.ndarray:
    """Rows from index 1024 on take a max that skips NaN."""
    return _elastic(x, tau, beta, nan_seen=np.arange(x.shape[0]) < 1024)


@register_kernel(function="elastic", backend="numpy", name="tail_dropped_n_mod_16_is_7")
def tail_dropped_n_mod_16_is_7(x: np.ndarray, *, tau: float, beta: float) -> np.ndarray:
    """Rows of n > 100 columns with n % 16 == 7 leave their last element out of the sum."""
    n = x.shape[1]
    return _elastic(x, tau, beta, drop_last=n > 100 and n % 16 == 7)


@register_kernel(function="elastic", backend="numpy", name="fp32_block_sums_in_a_chain",
                 dtypes=("fp32",))
def fp32_block_sums_in_a_chain(x: np.ndarray, *, tau: float, beta: float) -> np.ndarray:
    """fp64 but for the sum of the exponentials: fp32, its 1000-column blocks added one after
    another, an error growing like n / 1000 where the budget allows log2(n)."""
    y = _elastic(x, tau, beta)  # the special rows, and the shape of the answer
    x64 = x.astype(np.float64)
    kept = x64 >= 0
    s = np.where(kept, x64, -np.inf)
    m = s.max(axis=1, keepdims=True)
    ordinary = np.isfinite(m[:, 0]) & ~np.isnan(x64).any(axis=1) & ~(x64 == np.inf).any(axis=1)
    if not ordinary.any():
        return y
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        e = np.where(kept, np.exp((s - m) / tau), 0.0)[ordinary]
        e32 = e.astype(np.float32)
        total = np.zeros(e.shape[0], dtype=np.float32)
        for j in range(0, e.shape[1], 1000):
            total += e32[:, j:j + 1000].sum(axis=1, dtype=np.float32)
        den = total.astype(np.float64) + beta * np.exp(-m[ordinary, 0] / tau)
        y[ordinary] = (e / den[:, None]).astype(np.float32)
    return y
