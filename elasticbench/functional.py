"""Differentiable Elastic-Softmax (and softmax, softmax1) with hand-written backward passes.

    y = elastic_softmax(x, tau, beta, dim=-1)

The backward pass is docs/gradients.md section 2 evaluated in one pass over the saved output y
(and the input x, for the mask and the exponent arguments), never autograd through the
composite:

    c = sum_i g_i y_i                      dx_k  = y_k (g_k - c) / tau   (0 where masked)
    dtau  = (c * A - sum_i g_i y_i z'_i) / tau,   A = sum_k y_k z'_k - w m / tau
    dbeta = -c * exp(-m/tau) * y_max

with m the kept maximum, z'_i = (s_i - m)/tau <= 0 and w = beta exp(-m/tau) y_max the
offset's share of the row (1 - sum y). Both use 1/D' = y_max: the output at the kept
maximum is exp(0)/D', so the normalizer need not be saved and w never comes from the
cancelling 1 - sum y. docs/gradients.md derives this and the error budgets.

Broadcasting of tau and beta: each is a Python float, a 0-d tensor, or a tensor that
broadcasts against x like an elementwise operand and has size 1 along `dim` (one value per
row at most), e.g. shape (H, 1, 1) for one value per head of scores (B, H, L, L). Their
gradients are summed over the rows they were broadcast to. Tensors are trusted to hold
tau > 0 and beta >= 0 (ElasticSoftmax guarantees it); floats are checked.

Special values: the forward follows docs/definitions.md section 3. Backward: masked positions get
exactly 0, fully masked rows and rows with +inf (whose output no finite change of the
input moves) give exactly zero gradients, and a NaN row gives a NaN row in dx and NaN
dtau and dbeta. fp16/bf16 compute and accumulate in fp32; fp64 and fp32 in their own
precision. The same torch code runs on CPU and CUDA; with scalar tau and beta, CPU tensors
use the native C++ kernels (elasticbench.native, docs/native.md) where they build, and CUDA
tensors the Triton kernels of elasticbench.kernels.triton when they import.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from .functions import get_function

Scalar = float | torch.Tensor


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float64, torch.float32) else torch.float32


def _as_rows(v: Scalar, x: torch.Tensor, dim: int, dtype: torch.dtype) -> Scalar:
    """tau/beta laid out for rows-last x: a float stays a float, a tensor becomes (..., 1)."""
    if not isinstance(v, torch.Tensor):
        return v
    t = v.detach().to(device=x.device, dtype=dtype)
    if t.ndim == 0:
        return t
    if t.ndim > x.ndim:
        raise ValueError(f"a parameter of shape {tuple(v.shape)} has more dims than x {tuple(x.shape)}")
    t = t.reshape((1,) * (x.ndim - t.ndim) + tuple(t.shape))
    if t.shape[dim] != 1:
        raise ValueError(
            f"a parameter of shape {tuple(v.shape)} must have size 1 along dim {dim} "
            f"(one value per row at most) for x of shape {tuple(x.shape)}"
        )
    try:
        torch.broadcast_shapes(t.shape, x.shape)
    except RuntimeError:
        raise ValueError(
            f"a parameter of shape {tuple(v.shape)} does not broadcast against x {tuple(x.shape)}"
        ) from None
    return t.movedim(dim, -1)


# ---------------------------------------------------------------------------------------
# The computations on rows-last tensors (also the built-in torch kernels).


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
    xw = x.to(_work_dtype(x.dtype))
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
    wd = _work_dtype(x.dtype)
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
    z = torch.where(kept, (s - m0) / tau, 0)
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


def elastic_forward_rows(x: torch.Tensor, tau: Scalar, beta: Scalar) -> torch.Tensor:
    """Elastic-Softmax along the last axis: NVM mask, shift, offset rescaled by exp(-m/tau)."""
    return exp_normalize_forward(x, x >= 0, tau, beta)


def elastic_backward_rows(
    x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, tau: Scalar, beta: Scalar
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx and per-row (..., 1) contributions to dtau and dbeta, along the last axis."""
    dx, dtau, dbeta = exp_normalize_backward(x, y, g, x >= 0, tau, beta, params=True)
    assert dtau is not None and dbeta is not None
    return dx, dtau, dbeta


# ---------------------------------------------------------------------------------------
# Dispatch to the Triton kernels (CUDA, scalar parameters) when they exist.


class TritonElastic(NamedTuple):
    forward: Callable[..., torch.Tensor]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@functools.lru_cache(maxsize=1)
def _triton() -> TritonElastic | None:
    """The Triton kernels' (elastic_forward, elastic_backward); importing registers nothing."""
    try:
        from .kernels.triton.elastic_backward import elastic_backward
        from .kernels.triton.exp_family import elastic_forward
    except Exception:  # absent, or Triton unusable here: the torch code serves
        return None
    return TritonElastic(elastic_forward, elastic_backward)


def _scalar(*values: Scalar) -> bool:
    return all(not isinstance(v, torch.Tensor) or v.ndim == 0 for v in values)


def _use_triton(x: torch.Tensor, tau: Scalar, beta: Scalar) -> TritonElastic | None:
    return _triton() if x.is_cuda and _scalar(tau, beta) else None


@functools.lru_cache(maxsize=1)
def _native_extension():
    """The native C++ kernels (elasticbench.native), or None where they do not build."""
    from . import native

    return None if native.unavailable() else native.load()


def _use_native(x: torch.Tensor, *params: Scalar):
    """The native kernels for CPU tensors with scalar parameters (per-row ones: torch code)."""
    if x.device.type != "cpu" or not _scalar(*params) or x.dtype not in _NATIVE_DTYPES:
        return None
    return _native_extension()


_NATIVE_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _reduce_to(grad_rows: torch.Tensor, like: torch.Tensor, dim: int, ndim: int) -> torch.Tensor:
    """Sum per-row (..., 1) contributions back onto a parameter of like's shape."""
    if like.ndim == 0:
        return grad_rows.sum().to(like.dtype)
    g = grad_rows.movedim(-1, dim)
    padded = (1,) * (ndim - like.ndim) + tuple(like.shape)
    return g.sum_to_size(padded).reshape(like.shape).to(like.dtype)


class _ElasticSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, tau: Scalar, beta: Scalar, dim: int) -> torch.Tensor:  # type: ignore[override]
        wd = _work_dtype(x.dtype)
        t, b = _as_rows(tau, x, dim, wd), _as_rows(beta, x, dim, wd)
        xr = x.movedim(dim, -1)
        tk = _use_triton(x, tau, beta)
        native = _use_native(x, tau, beta)
        if tk is not None:
            shape = xr.shape
            y = tk.forward(xr.reshape(-1, shape[-1]).contiguous(), float(t), float(b))
            y = y.reshape(shape)
        elif native is not None:
            y = native.exp_forward(xr, native.Structure.FUSED, True, -math.inf, float(t), float(b))
        else:
            y = elastic_forward_rows(xr, t, b)
        ctx.save_for_backward(x, y)
        ctx.dim, ctx.t, ctx.b, ctx.triton = dim, t, b, tk is not None
        ctx.native = native
        ctx.tau_like = tau if isinstance(tau, torch.Tensor) else None
        ctx.beta_like = beta if isinstance(beta, torch.Tensor) else None
        return y.movedim(-1, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, y = ctx.saved_tensors
        dim = ctx.dim
        xr, gr = x.movedim(dim, -1), grad.movedim(dim, -1)
        if ctx.triton:
            tk = _triton()
            assert tk is not None
            n = xr.shape[-1]
            dx, dtau, dbeta = tk.backward(
                y.reshape(-1, n), gr.reshape(-1, n).contiguous(),
                xr.reshape(-1, n).contiguous(), float(ctx.t), float(ctx.b))
            dx = dx.reshape(xr.shape)
            dtau_rows = torch.as_tensor(dtau, device=x.device).reshape(1)
            dbeta_rows = torch.as_tensor(dbeta, device=x.device).reshape(1)
        elif ctx.native is not None:
            dx, dtau_rows, dbeta_rows = ctx.native.exp_backward(
                xr, y, gr, True, float(ctx.t), float(ctx.b), any(ctx.needs_input_grad[1:3]))
            dtau_rows = dtau_rows.reshape(*xr.shape[:-1], 1)
            dbeta_rows = dbeta_rows.reshape(*xr.shape[:-1], 1)
        else:
            dx, dtau_rows, dbeta_rows = elastic_backward_rows(xr, y, gr, ctx.t, ctx.b)
        dtau = dbeta = None
        if ctx.needs_input_grad[1] and ctx.tau_like is not None:
            dtau = _reduce_to(dtau_rows, ctx.tau_like, dim, x.ndim)
        if ctx.needs_input_grad[2] and ctx.beta_like is not None:
            dbeta = _reduce_to(dbeta_rows, ctx.beta_like, dim, x.ndim)
        return dx.movedim(-1, dim), dtau, dbeta, None


def _check_float(name: str, value: Scalar) -> Scalar:
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a float or a floating-point tensor")
        return value
    params = {p.name: p for p in get_function("elastic").params}
    return params[name].validate(value)


def elastic_softmax(x: torch.Tensor, tau: Scalar = 1.0, beta: Scalar = 1.0, dim: int = -1):
    """Elastic-Softmax of x along dim, differentiable in x, tau and beta (see module doc)."""
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    tau, beta = _check_float("tau", tau), _check_float("beta", beta)
    return _ElasticSoftmax.apply(x, tau, beta, dim % max(x.ndim, 1))


class _NormalizedExp(torch.autograd.Function):
    """softmax (floor -inf) and softmax1 (floor 0, offset 1) with dx = y (g - c)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, one: bool) -> torch.Tensor:  # type: ignore[override]
        xr = x.movedim(dim, -1)
        floor = 0.0 if one else -math.inf
        native = _use_native(x)
        if native is not None:
            y = native.exp_forward(xr, native.Structure.FUSED, False, floor, 1.0, 1.0 if one else 0.0)
        else:
            y = exp_normalize_forward(xr, xr > -math.inf, 1.0, 1.0 if one else None, floor)
        ctx.save_for_backward(x, y)
        ctx.dim, ctx.floor, ctx.native, ctx.one = dim, floor, native, one
        return y.movedim(-1, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, y = ctx.saved_tensors
        xr, gr = x.movedim(ctx.dim, -1), grad.movedim(ctx.dim, -1)
        if ctx.native is not None:
            dx = ctx.native.exp_backward(xr, y, gr, False, 1.0, 1.0 if ctx.one else 0.0, False)[0]
        else:
            dx, _, _ = exp_normalize_backward(xr, y, gr, xr > -math.inf, floor=ctx.floor)
        return dx.movedim(-1, ctx.dim), None, None


def elastic_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, tau: Scalar,
                      beta: Scalar, scale: float | None = None, causal: bool = False
                      ) -> torch.Tensor:
    """Elastic-Softmax attention, as scaled_dot_product_attention with Elastic weights.

    q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, Dv) -> (B, H, Lq, Dv); scale defaults to
    1/sqrt(D); causal hides key j from query i when j > i (top-left, as SDPA). tau and beta
    are floats, 0-d tensors or per-head tensors ((H,) or broadcasting against (B, H, 1, 1)).
    Differentiable in q, k, v, tau and beta with a tiled backward that recomputes the
    weights from two saved statistics per query (docs/attention.md).
    """
    from .attention.autograd import ElasticAttentionFunction
    from .attention.layout import check_operands, default_scale

    check_operands(q, k, v)
    tau, beta = _check_float("tau", tau), _check_float("beta", beta)
    if scale is None:
        scale = default_scale(q.shape[-1])
    elif not (isinstance(scale, int | float) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    return ElasticAttentionFunction.apply(q, k, v, tau, beta, float(scale), bool(causal))


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Safe softmax along dim (all -inf rows give zeros) with a hand-written backward."""
    return _NormalizedExp.apply(x, dim % max(x.ndim, 1), False)


def softmax1(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x) / (1 + sum exp(x)) along dim, stable, with a hand-written backward."""
    return _NormalizedExp.apply(x, dim % max(x.ndim, 1), True)


__all__ = ["elastic_attention", "elastic_softmax", "softmax", "softmax1"]
