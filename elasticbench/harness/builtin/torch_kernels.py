"""torch kernels for the whole family. Device-agnostic: the same code runs on CUDA tensors.

The exp-normalize members are elasticbench.rows.exp_normalize's forward and backward, the
torch tier of elasticbench.functional's autograd path, so the kernel verified here is the
code a model runs.

fp64 and fp32 compute in their own precision; fp16 and bf16 compute and accumulate in
fp32 and round once at the end. Special values follow docs/definitions.md section 3.
"""

from __future__ import annotations

import math

import torch

from elasticbench.harness.kernel_spec import register_kernel
from elasticbench.rows.exp_normalize import exp_normalize_backward, exp_normalize_forward


def _work(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float64, torch.float32) else x.float()


def _finish(x: torch.Tensor, num: torch.Tensor, den: torch.Tensor, nan_row: torch.Tensor):
    """num / den with 0/0 -> 0, NaN rows restored, rounded once to the input's dtype."""
    y = torch.where(den > 0, num / torch.where(den > 0, den, 1), 0)
    y = y.masked_fill(nan_row, math.nan)
    return y.to(x.dtype)


def _weight_normalize(x, w, constant: float = 0.0):
    """w / (constant + sum w) for weights w >= 0; rows whose largest weight exceeds 1 are
    scaled by it first, so neither the sum nor constant/scale can overflow."""
    nan_row = w.isnan().any(dim=-1, keepdim=True)
    w = w.nan_to_num(nan=0.0, posinf=math.inf)
    top = w.amax(dim=-1, keepdim=True)
    inf_row = top == math.inf
    scale = torch.where((top > 1) & ~inf_row, top, 1)
    ws = torch.where(inf_row, (w == math.inf).to(w.dtype), w / scale)
    den = ws.sum(dim=-1, keepdim=True) + torch.where(inf_row, 0, constant / scale)
    return _finish(x, ws, den, nan_row)


@register_kernel(function="elastic", backend="torch", name="torch_elastic", compiles=False)
def torch_elastic(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Elastic-Softmax in torch: mask, shift by the kept max, offset rescaled by exp(-m/tau)."""
    return exp_normalize_forward(x, x >= 0, tau, offset=beta)


@register_kernel(function="softmax", backend="torch", name="torch_safe_softmax", compiles=False)
def torch_safe_softmax(x: torch.Tensor) -> torch.Tensor:
    """Safe softmax in torch: shifted by the max; an all -inf row gives zeros."""
    return exp_normalize_forward(x, x > -math.inf)


@register_kernel(function="softmax1", backend="torch", name="torch_softmax1", compiles=False)
def torch_softmax1(x: torch.Tensor) -> torch.Tensor:
    """Softmax1 in torch: shift m = max(max x, 0), the 1 rescaled to exp(-m)."""
    return exp_normalize_forward(x, x > -math.inf, offset=1.0, floor=0.0)


@register_kernel(function="stablemax", backend="torch", name="torch_stablemax", compiles=False)
def torch_stablemax(x: torch.Tensor) -> torch.Tensor:
    """Stablemax in torch, weights scaled by the row maximum before summing."""
    xw = _work(x)
    w = torch.where(xw >= 0, xw + 1, 1 / (1 - xw))
    return _weight_normalize(x, w)


@register_kernel(function="symax", backend="torch", name="torch_symax", compiles=False)
def torch_symax(x: torch.Tensor, *, eta: float) -> torch.Tensor:
    """Symax in torch: |x| / (eta + sum |x|), scaled by max |x| before summing."""
    return _weight_normalize(x, _work(x).abs(), eta)


# ---------------------------------------------------------------------------------------
# Backward kernels (mode="bwd"): fn(x, y, g, **params) -> dx, or (dx, dtau, dbeta) for
# elastic. They are the very code of elasticbench.functional's backward on the torch tier.


@register_kernel(function="elastic", backend="torch", name="torch_elastic_bwd", mode="bwd",
                 compiles=False)
def torch_elastic_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, *, tau: float,
                      beta: float):
    """Elastic-Softmax backward: dx, dtau, dbeta in one pass over y (1/D' read as max y)."""
    dx, dtau, dbeta = exp_normalize_backward(x, y, g, x >= 0, tau, beta, params=True)
    assert dtau is not None and dbeta is not None
    return dx, dtau.sum(), dbeta.sum()


@register_kernel(function="softmax", backend="torch", name="torch_safe_softmax_bwd", mode="bwd",
                 compiles=False)
def torch_safe_softmax_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Softmax backward: y (g - sum g y); zeros on all -inf rows and -inf positions."""
    return exp_normalize_backward(x, y, g, x > -math.inf)[0]


@register_kernel(function="softmax1", backend="torch", name="torch_softmax1_bwd", mode="bwd",
                 compiles=False)
def torch_softmax1_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Softmax1 backward: y (g - sum g y), the same form as softmax (the 1 is a constant)."""
    return exp_normalize_backward(x, y, g, x > -math.inf, floor=0.0)[0]
