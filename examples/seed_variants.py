"""The published variants of the seed proposal, written from their descriptions.

Each is the definition of docs/definitions.md section 1 with exactly one change, so
`elasticbench verify --kernel-file examples/seed_variants.py` shows that change alone:

- seed_eps_unscaled: subtracts the max for stability, then adds the offset unscaled
  (the proposal's eps = 1e-10 hides this; with a learned beta near 1 it is a large error).
- seed_uniform_fallback: returns a uniform row when every logit is negative, where the
  definition gives zeros.
- seed_where_mask: the literal mask `where(x >= 0, x, -inf)`, which silently turns a NaN
  into a masked position instead of propagating it.
"""

import numpy as np

from elasticbench import register_kernel


def _elastic(x, tau, beta, *, rescale=True, uniform_if_empty=False, nan_propagates=True):
    """Elastic-Softmax in float64 with the special-value policy; each flag undoes one rule."""
    xw = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        s = np.where(xw >= 0, xw, -np.inf)  # NaN >= 0 is False: NaN lands among the masked
    m = s.max(axis=-1, keepdims=True)
    inf_row = m == np.inf
    m0 = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore"):
        e = np.where(inf_row, s == np.inf, np.exp((s - m0) / tau))
    offset = beta * np.exp(-m0 / tau) if rescale else beta
    den = e.sum(axis=-1, keepdims=True) + np.where(inf_row, 0.0, offset)
    y = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    if uniform_if_empty:
        y[~(xw >= 0).any(axis=-1)] = 1.0 / x.shape[-1]
    if nan_propagates:
        y[np.isnan(xw).any(axis=-1)] = np.nan
    return y.astype(x.dtype)


@register_kernel(function="elastic", backend="numpy", name="seed_eps_unscaled")
def seed_eps_unscaled(x, *, tau, beta):
    """Shifted by the max, offset added without the exp(-m/tau) rescaling."""
    return _elastic(x, tau, beta, rescale=False)


@register_kernel(function="elastic", backend="numpy", name="seed_uniform_fallback")
def seed_uniform_fallback(x, *, tau, beta):
    """A row with no non-negative logit becomes uniform instead of zeros."""
    return _elastic(x, tau, beta, uniform_if_empty=True)


@register_kernel(function="elastic", backend="numpy", name="seed_where_mask")
def seed_where_mask(x, *, tau, beta):
    """The literal where(x >= 0, x, -inf) mask: a NaN is masked away, not propagated."""
    return _elastic(x, tau, beta, nan_propagates=False)
