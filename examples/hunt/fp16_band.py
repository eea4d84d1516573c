"""An Elastic-Softmax kernel that is right except on a band of row lengths: fp16 rows of
5000 to 6000 columns have their exponentials summed in fp16 (docs/hunt.md section 5: the
default matrix has no such length, so only a search finds it).

    elasticbench hunt --kernel-file examples/hunt/fp16_band.py --budget 120
"""

from __future__ import annotations

import numpy as np

from elasticbench import register_kernel


@register_kernel(function="elastic", backend="numpy", name="fp16_band_sum",
                 dtypes=("fp16",))
def fp16_band_sum(x: np.ndarray, *, tau: float, beta: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    nan_rows = np.isnan(x64).any(axis=1)
    kept = x64 >= 0
    s = np.where(kept, x64, -np.inf)
    m = s.max(axis=1, keepdims=True)
    safe_m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(kept, np.exp((s - safe_m) / tau), 0.0)
        if 5000 <= x.shape[1] <= 6000:
            total = e.astype(np.float16).sum(axis=1, keepdims=True, dtype=np.float16)
            total = total.astype(np.float64)
        else:
            total = e.sum(axis=1, keepdims=True)
        den = total + beta * np.exp(-safe_m / tau)
        y = np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)
        inf_rows = (x64 == np.inf).any(axis=1)
        big = x64 == np.inf
        share = big / np.maximum(big.sum(axis=1, keepdims=True), 1)
    y = np.where(inf_rows[:, None], share, y)
    y = np.where(nan_rows[:, None], np.nan, y)
    return y.astype(x.dtype)
