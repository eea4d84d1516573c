"""The exp family in torch, rows last: the forward and its one-pass backward.

    y_i = exp((s_i - m)/tau) / (sum_k exp((s_k - m)/tau) + offset exp(-m/tau))

over the kept positions s (others 0), m = max(max kept, floor): Elastic-Softmax keeps
x >= 0 (offset beta), softmax and softmax1 keep x > -inf (softmax1: floor 0, offset 1).
The backward is docs/gradients.md section 2 evaluated in one pass over the saved output y
(and the input x, for the mask and the exponent arguments), never autograd through the
composite:

    c = sum_i g_i y_i                      dx_k  = y_k (g_k - c) / tau   (0 where masked)
    dtau  = (c * A - sum_i g_i y_i z'_i) / tau,   A = sum_k y_k z'_k - w m / tau
    dbeta = -c * exp(-m/tau) * y_max

with m the kept maximum, z'_i = (s_i - m)/tau <= 0 and w = beta exp(-m/tau) y_max the
offset's share of the row (1 - sum y). Both use 1/D' = y_max: the output at the kept
maximum is exp(0)/D', so the normalizer need not be saved and w never comes from the
cancelling 1 - sum y. docs/gradients.md derives this and the error budgets.

Special values follow docs/definitions.md section 3 in the forward. Backward: masked
positions get exactly 0, fully masked rows and rows with +inf (whose output no finite
change of the input moves) give exactly zero gradients, and a NaN row gives a NaN row in dx
and NaN dtau and dbeta. fp16/bf16 compute and accumulate in fp32; fp64 and fp32 in their
own precision. The same code runs on CPU and CUDA tensors.
"""

from __future__ import annotations

import math

import torch

from .param_layout import Scalar, work_dtype


def _keep_and_shift(xw: torch.Tensor, keep: torch.Tensor, floor: float):
    """nan_row, finite_row, kept values s (others -inf) and the shift m0 (0 where undefined)."""
    nan_row = xw.isnan().any(dim=-1, keepdim=True)
    s = xw.masked_fill(~keep, -math.inf)
    m = s.amax(dim=-1, keepdim=True).clamp_min(floor)
    inf_row = m == math.inf
    finite_row = ~nan_row & ~inf_row
    m0 = torch.where(m.isfinite(), m, 0)  # rows with nothing kept: no shift
    return nan_row, inf_row, finite_row, s, m0


def exp_normalize_forward(
    x: torch.Tensor, keep: torch.Tensor, tau: Scalar = 1.0, offset: Scalar | None = None,
    floor: float = -math.inf,
) -> torch.Tensor:
    """exp((s - m)/tau) over kept positions / (their sum + offset * exp(-m/tau)), rows last."""
    xw = x.to(work_dtype(x.dtype))
    nan_row, inf_row, _, s, m0 = _keep_and_shift(xw, keep, floor)
    e = torch.exp((s - m0) / tau)
    e = torch.where(inf_row, (s == math.inf).to(xw.dtype), e)
    den = e.sum(dim=-1, keepdim=True)
    if offset is not None:
        den = den + torch.where(inf_row, 0, offset * torch.exp(-m0 / tau))
    y = torch.where(den > 0, e / torch.where(den > 0, den, 1), 0)
    return y.masked_fill(nan_row, math.nan).to(x.dtype)


def exp_normalize_backward(
    x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, keep: torch.Tensor, tau: Scalar = 1.0,
    offset: Scalar | None = None, floor: float = -math.inf, params: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """dx (x's dtype) and, with params=True, per-row dtau and doffset (work dtype, (..., 1)).

    One pass over y, g and x, rows last; see the module docstring for the formulas.
    """
    wd = work_dtype(x.dtype)
    xw = x.to(wd)
    nan_row, _, finite_row, s, m0 = _keep_and_shift(xw, keep, floor)
    kept = keep & finite_row
    yk = torch.where(kept, y.to(wd), 0)
    gw = g.to(wd)
    gy = gw * yk
    c = gy.sum(dim=-1, keepdim=True)
    # (g - c)/tau first: a subnormal y*(g - c) divided by a small tau would magnify its error
    dx = torch.where(kept, yk * ((gw - c) / tau), 0).masked_fill(nan_row, math.nan).to(x.dtype)
    if not params:
        return dx, None, None
    # (m0 where not kept: the -inf of masked positions would make the second order NaN)
    z = (torch.where(kept, s, m0) - m0) / tau
    live = yk != 0  # y = 0 where z = -inf: keep 0 * inf out of the sums
    yz = torch.where(live, yk * z, 0).sum(dim=-1, keepdim=True)
    gyz = torch.where(live, gy * z, 0).sum(dim=-1, keepdim=True)
    mt = m0 / tau
    q = torch.exp(-mt) * yk.amax(dim=-1, keepdim=True)  # exp(-m/tau)/D' = 1/D
    w = offset * q if offset is not None else torch.zeros_like(q)
    wmt = torch.where(w != 0, w * mt, 0)  # w underflows long before m/tau overflows
    dtau = ((c * (yz - wmt) - gyz) / tau).masked_fill(nan_row, math.nan)
    doffset = (-c * q).masked_fill(nan_row, math.nan)
    return dx, dtau, doffset

