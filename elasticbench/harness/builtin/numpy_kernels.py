"""NumPy kernels for the whole family, in fp64/fp32/fp16/bf16.

fp64 and fp32 compute in their own precision; fp16 and bf16 (ml_dtypes) compute and
accumulate in fp32 and round once at the end. Every kernel applies the special-value
policy of docs/definitions.md section 3: a NaN anywhere makes the row NaN, +inf logits share the
row equally, a row with nothing left gives zeros (0/0 is 0). Inputs in any layout are
made row-contiguous first. Row sums go through `_tree_sum`, a balanced tree of additions whose
error is at most ceil(log2 n) roundings of the sum, the summation term of the budgets: NumPy's
own sum adds up to 16 terms one after another in each of 8 accumulators (and a short row's
remainder after them), which a row of one dominant term and many small ones exposes
(`elasticbench hunt` found numpy_elastic 10 ulp off at 1x45 fp32, budget 9.49).
"""

from __future__ import annotations

import numpy as np

from elasticbench.harness.kernel_spec import register_kernel


def _work_dtype(x: np.ndarray) -> type:
    return np.float64 if x.dtype == np.float64 else np.float32


def _tree_sum(a: np.ndarray) -> np.ndarray:
    """Sums along the last axis (kept as length 1) by a balanced tree: pairs (i, i + h) for
    h half the next power of two (the unpaired ones alone), then halves added until one is
    left, as if the row were zero-padded to a power of two."""
    n = a.shape[-1]
    if n <= 1:
        return a.copy() if n else np.zeros((*a.shape[:-1], 1), dtype=a.dtype)
    h = 1 << ((n - 1).bit_length() - 1)
    b = a[..., :h].copy()
    b[..., : n - h] += a[..., h:]
    while b.shape[-1] > 1:
        half = b.shape[-1] // 2
        b = b[..., :half] + b[..., half:]
    return b


def _finish(x: np.ndarray, num: np.ndarray, den: np.ndarray, nan_row: np.ndarray) -> np.ndarray:
    """num / den with 0/0 -> 0, NaN rows restored, rounded once to the input's dtype; num (a
    temporary of the caller's, 0 wherever its row's den is 0) is divided in place."""
    y = np.divide(num, np.where(den > 0, den, 1), out=num)
    if nan_row.any():
        y[nan_row[..., 0]] = np.nan
    return y.astype(x.dtype, copy=False)


def _exp_normalize(
    x: np.ndarray, keep: np.ndarray, *, tau: float = 1.0, floor: float = -np.inf, offset=None
) -> np.ndarray:
    """exp((x - m)/tau) over kept positions, divided by their sum plus offset(m).

    m = max(max kept, floor); offset(m) is the constant denominator term already
    rescaled by the shift (beta * exp(-m/tau), or exp(-m)).
    """
    xw = np.ascontiguousarray(x, dtype=_work_dtype(x))
    nan_row = np.isnan(xw.max(axis=-1, keepdims=True))  # max propagates NaN
    s = np.where(keep, xw, -np.inf)
    m = np.maximum(s.max(axis=-1, keepdims=True), floor)
    inf_row = m == np.inf
    m0 = np.where(np.isfinite(m), m, 0).astype(xw.dtype)  # rows with nothing kept: no shift
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.subtract(s, m0, out=s)  # s is ours: exp((s - m0)/tau) formed in place
        if tau != 1:
            np.divide(e, xw.dtype.type(tau), out=e)
        np.exp(e, out=e)
        if inf_row.any():
            e = np.where(inf_row, (keep & (xw == np.inf)).astype(xw.dtype), e)
        den = _tree_sum(e)
        if offset is not None:
            den = den + np.where(inf_row, 0, offset(m0)).astype(xw.dtype)
    return _finish(x, e, den, nan_row)


def _weight_normalize(x: np.ndarray, w: np.ndarray, constant: float = 0.0) -> np.ndarray:
    """w / (constant + sum w) for weights w >= 0. Rows whose largest weight exceeds 1 are
    scaled by it first, so the sum cannot overflow (and constant/scale cannot either)."""
    w = np.ascontiguousarray(w)
    nan_row = np.isnan(w).any(axis=-1, keepdims=True)
    w = np.where(np.isnan(w), 0, w)
    top = w.max(axis=-1, keepdims=True)
    inf_row = top == np.inf
    scale = np.where((top > 1) & ~inf_row, top, 1).astype(w.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        ws = np.where(inf_row, (w == np.inf).astype(w.dtype), w / scale)
        den = _tree_sum(ws) + np.where(inf_row, 0, constant / scale)
    return _finish(x, ws, den.astype(w.dtype), nan_row)


@register_kernel(function="elastic", backend="numpy", name="numpy_elastic")
def numpy_elastic(x: np.ndarray, *, tau: float, beta: float) -> np.ndarray:
    """Elastic-Softmax in NumPy: mask, shift by the kept max, offset rescaled by exp(-m/tau)."""
    with np.errstate(invalid="ignore"):
        keep = x >= 0
    return _exp_normalize(x, keep, tau=tau, offset=lambda m: beta * np.exp(-m / tau))


@register_kernel(function="softmax", backend="numpy", name="numpy_softmax")
def numpy_softmax(x: np.ndarray) -> np.ndarray:
    """Safe softmax in NumPy: shifted by the max; an all -inf row gives zeros."""
    return _exp_normalize(x, x > -np.inf)


@register_kernel(function="softmax1", backend="numpy", name="numpy_softmax1")
def numpy_softmax1(x: np.ndarray) -> np.ndarray:
    """Softmax1 in NumPy: shift m = max(max x, 0), the 1 rescaled to exp(-m)."""
    return _exp_normalize(x, x > -np.inf, floor=0.0, offset=lambda m: np.exp(-m))


@register_kernel(function="stablemax", backend="numpy", name="numpy_stablemax")
def numpy_stablemax(x: np.ndarray) -> np.ndarray:
    """Stablemax in NumPy, weights scaled by the row maximum before summing."""
    xw = x.astype(_work_dtype(x))
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(xw >= 0, xw + 1, 1 / (1 - xw))
    return _weight_normalize(x, w)


@register_kernel(function="symax", backend="numpy", name="numpy_symax")
def numpy_symax(x: np.ndarray, *, eta: float) -> np.ndarray:
    """Symax in NumPy: |x| / (eta + sum |x|), scaled by max |x| before summing."""
    return _weight_normalize(x, np.abs(x.astype(_work_dtype(x))), eta)


# ---------------------------------------------------------------------------------------
# Backward kernels (mode="bwd"): fn(x, y, g, **params) -> dx, or (dx, dtau, dbeta) for
# elastic. Formulas in docs/gradients.md; fp16/bf16 accumulate in fp32.


def _exp_normalize_bwd(x, y, g, keep, *, tau=1.0, offset=None, floor=-np.inf, params=False):
    """dx = y (g - c)/tau on kept positions of finite rows; with params, the summed dtau
    and d(offset). 1/D' is read off the output as max y (the kept maximum has exp(0))."""
    wd = _work_dtype(x)
    xw = x.astype(wd)
    nan_row = np.isnan(xw).any(axis=-1, keepdims=True)
    s = np.where(keep, xw, -np.inf)
    m = np.maximum(s.max(axis=-1, keepdims=True), floor)
    finite_row = ~nan_row & (m != np.inf)
    m0 = np.where(np.isfinite(m), m, 0).astype(wd)
    kept = keep & finite_row
    yk = np.where(kept, y.astype(wd), 0).astype(wd)
    gy = g.astype(wd) * yk
    c = _tree_sum(gy)
    t = wd(tau)
    dx = np.where(kept, yk * ((g.astype(wd) - c) / t), 0).astype(wd)
    dx[np.broadcast_to(nan_row, dx.shape)] = np.nan
    dx = dx.astype(x.dtype)
    if not params:
        return dx
    with np.errstate(over="ignore", invalid="ignore"):
        z = np.where(kept, (s - m0) / t, 0)
        live = yk != 0
        yz = _tree_sum(np.where(live, yk * z, 0))
        gyz = _tree_sum(np.where(live, gy * z, 0))
        mt = m0 / t
        q = np.exp(-mt) * yk.max(axis=-1, keepdims=True)
        w = wd(offset) * q
        wmt = np.where(w != 0, w * mt, 0)
        dtau = (c * (yz - wmt) - gyz) / t
        doff = -c * q
    any_nan = bool(nan_row.any())
    return (dx, float("nan") if any_nan else float(dtau.sum(dtype=wd)),
            float("nan") if any_nan else float(doff.sum(dtype=wd)))


@register_kernel(function="elastic", backend="numpy", name="numpy_elastic_bwd", mode="bwd")
def numpy_elastic_bwd(x: np.ndarray, y: np.ndarray, g: np.ndarray, *, tau: float, beta: float):
    """Elastic-Softmax backward in NumPy: dx, dtau, dbeta from the saved output."""
    with np.errstate(invalid="ignore"):
        keep = x.astype(_work_dtype(x)) >= 0
    return _exp_normalize_bwd(x, y, g, keep, tau=tau, offset=beta, params=True)


@register_kernel(function="softmax", backend="numpy", name="numpy_softmax_bwd", mode="bwd")
def numpy_softmax_bwd(x: np.ndarray, y: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Softmax backward in NumPy: y (g - sum g y)."""
    return _exp_normalize_bwd(x, y, g, x.astype(_work_dtype(x)) > -np.inf)


@register_kernel(function="softmax1", backend="numpy", name="numpy_softmax1_bwd", mode="bwd")
def numpy_softmax1_bwd(x: np.ndarray, y: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Softmax1 backward in NumPy: y (g - sum g y)."""
    return _exp_normalize_bwd(x, y, g, x.astype(_work_dtype(x)) > -np.inf, floor=0.0)
