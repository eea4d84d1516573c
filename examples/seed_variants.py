"""The published variants of the seed proposal, written from their descriptions.

Each differs from the definition in DESIGN.md section 1 in one way, and
`elasticbench verify --kernel-file examples/seed_variants.py` shows where:

- seed_eps_unscaled: subtracts the max for stability, then adds the offset unscaled
  (the proposal's eps = 1e-10 hides this; with a learned beta near 1 it is a large error).
- seed_uniform_fallback: returns a uniform row when every logit is negative, where the
  definition gives zeros.
- seed_where_mask: the literal mask `where(x >= 0, x, -inf)`, which silently turns a NaN
  into a masked position instead of propagating it.
"""

import numpy as np

from elasticbench import register_kernel


def _shifted(x: np.ndarray, tau: float):
    xw = x.astype(np.float64)
    s = np.where(xw >= 0, xw, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m0 = np.where(np.isfinite(m), m, 0.0)
    return s, np.exp((s - m0) / tau)


@register_kernel(function="elastic", backend="numpy", name="seed_eps_unscaled")
def seed_eps_unscaled(x, *, tau, beta):
    """Shifted by the max, offset added without the exp(-m/tau) rescaling."""
    _, e = _shifted(x, tau)
    with np.errstate(invalid="ignore"):
        y = e / (e.sum(axis=-1, keepdims=True) + beta)
    y[np.isnan(x.astype(np.float64)).any(axis=-1)] = np.nan
    return np.nan_to_num(y, nan=np.nan, posinf=np.nan).astype(x.dtype)


@register_kernel(function="elastic", backend="numpy", name="seed_uniform_fallback")
def seed_uniform_fallback(x, *, tau, beta):
    """Correct formula, but a row with no non-negative logit becomes uniform."""
    xw = x.astype(np.float64)
    s, e = _shifted(x, tau)
    m = s.max(axis=-1, keepdims=True)
    den = e.sum(axis=-1, keepdims=True) + beta * np.exp(-np.where(np.isfinite(m), m, 0) / tau)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = e / den
    none_kept = ~(xw >= 0).any(axis=-1)
    y[none_kept] = 1.0 / x.shape[-1]
    y[np.isnan(xw).any(axis=-1)] = np.nan
    return y.astype(x.dtype)


@register_kernel(function="elastic", backend="numpy", name="seed_where_mask")
def seed_where_mask(x, *, tau, beta):
    """Correct offset, but the literal where(x >= 0, x, -inf) mask swallows NaN."""
    s, e = _shifted(x, tau)
    m = s.max(axis=-1, keepdims=True)
    den = e.sum(axis=-1, keepdims=True) + beta * np.exp(-np.where(np.isfinite(m), m, 0) / tau)
    with np.errstate(invalid="ignore"):
        y = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    inf_row = (m == np.inf)[:, 0]
    y[inf_row] = (s[inf_row] == np.inf) / (s[inf_row] == np.inf).sum(-1, keepdims=True)
    return y.astype(x.dtype)
