"""Two plausible but wrong Elastic-Softmax backward kernels, for `verify --mode bwd` to catch.

    elasticbench verify --mode bwd --kernel-file examples/wrong_backward.py    # exit 1

Both share one correct NumPy backward (float64 inside) and break it in one place:
- `elastic_bwd_no_rescale` forgets to rescale beta by exp(-m/tau) (docs/gradients.md section 2):
  it takes 1/D = max y instead of exp(-m/tau) * max y, so dbeta (and the offset's share in
  dtau) are off by exp(m/tau): right only when the kept row maximum m is 0.
- `elastic_bwd_no_mask` recomputes the output from x but forgets Negative Value Masking,
  so negative logits get a gradient where they must get exactly 0.
"""

import numpy as np

from elasticbench import register_kernel


def _backward(x, y, g, tau, beta, *, rescale=True, mask=True):
    xf, gf = x.astype(np.float64), g.astype(np.float64)
    nan_row = np.isnan(xf).any(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        keep = xf >= 0 if mask else xf > -np.inf
    s = np.where(keep, xf, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    kept = keep & ~nan_row & (m != np.inf)
    m0 = np.where(np.isfinite(m), m, 0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if mask:
            yk = np.where(kept, y.astype(np.float64), 0)
        else:  # recompute y from x: the mask that should be here is missing
            e = np.where(kept, np.exp((s - m0) / tau), 0)
            den = e.sum(axis=-1, keepdims=True) + beta * np.exp(-m0 / tau)
            yk = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
        c = (gf * yk).sum(axis=-1, keepdims=True)
        dx = np.where(kept, yk * ((gf - c) / tau), 0)
        dx[np.broadcast_to(nan_row, dx.shape)] = np.nan
        z = np.where(kept, (s - m0) / tau, 0)
        live = yk != 0
        ymax = yk.max(axis=-1, keepdims=True)
        q = np.exp(-m0 / tau) * ymax if rescale else ymax  # 1/D, or the bug's 1/D'
        w = beta * q
        wmt = np.where(w != 0, w * m0 / tau, 0)
        dtau = ((c * (np.where(live, yk * z, 0).sum(axis=-1, keepdims=True) - wmt)
                 - np.where(live, gf * yk * z, 0).sum(axis=-1, keepdims=True)) / tau).sum()
        dbeta = (-c * q).sum()
    if nan_row.any():
        dtau = dbeta = np.nan
    return dx.astype(x.dtype), float(dtau), float(dbeta)


@register_kernel(function="elastic", backend="numpy", name="elastic_bwd_no_rescale", mode="bwd")
def elastic_bwd_no_rescale(x, y, g, *, tau, beta):
    """dbeta with the offset not rescaled by exp(-m/tau)."""
    return _backward(x, y, g, tau, beta, rescale=False)


@register_kernel(function="elastic", backend="numpy", name="elastic_bwd_no_mask", mode="bwd")
def elastic_bwd_no_mask(x, y, g, *, tau, beta):
    """Output recomputed from x without Negative Value Masking: negatives get gradient."""
    return _backward(x, y, g, tau, beta, mask=False)
