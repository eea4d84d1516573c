"""The autograd function of Elastic attention, and the choice of implementation.

Every implementation has the contract of `flash` (forward -> (out, m, den), backward from
those row statistics); the first whose `accepts` says yes runs: the fused native kernel
on CPU tensors when it is built, the Triton kernel on CUDA tensors, else the tiled torch
code. The forward saves q, k, v, out, m and den: O(length) beyond the inputs and output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import cpp, flash
from .layout import Scalar, head_params, reduce_to, work_dtype


@dataclass(frozen=True)
class Implementation:
    """One implementation of the flash contract; accepts(q) says whether it takes q."""

    name: str
    accepts: Callable[[torch.Tensor], bool]
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    backward: Callable[..., tuple[torch.Tensor, ...]]


TORCH = Implementation("torch", lambda q: True, flash.forward, flash.backward)
CPP = Implementation("cpp", cpp.accepts, cpp.forward, cpp.backward)


@functools.lru_cache(maxsize=1)
def implementations() -> tuple[Implementation, ...]:
    """The implementations in order of preference; the torch one always comes last."""
    return (CPP, TORCH)


def choose(q: torch.Tensor) -> Implementation:
    return next(i for i in implementations() if i.accepts(q))


def bh_params(value: Scalar, q: torch.Tensor) -> torch.Tensor:
    """tau or beta as a contiguous (batch, heads) tensor in q's working precision."""
    b, h = q.shape[:2]
    p = head_params(value, b, h, work_dtype(q.dtype), q.device)
    if isinstance(p, float):
        return torch.full((b, h), p, dtype=work_dtype(q.dtype), device=q.device)
    return p[:, :, 0, 0].expand(b, h).contiguous()


class ElasticAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, tau, beta, scale: float, causal: bool):  # type: ignore[override]
        impl = choose(q)
        t, b = bh_params(tau, q), bh_params(beta, q)
        out, m, den = impl.forward(q, k, v, t, b, scale, causal)
        ctx.save_for_backward(q, k, v, out, m, den, t, b)
        ctx.impl, ctx.scale, ctx.causal = impl, scale, causal
        ctx.tau_like = tau if isinstance(tau, torch.Tensor) else None
        ctx.beta_like = beta if isinstance(beta, torch.Tensor) else None
        ctx.params = (tau, beta)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if torch.is_grad_enabled():
            return _differentiable_backward(ctx, grad)
        q, k, v, out, m, den, t, b = ctx.saved_tensors
        dq, dk, dv, dtau_bh, dbeta_bh = ctx.impl.backward(
            q, k, v, out, grad.contiguous(), m, den, t, b, ctx.scale, ctx.causal)
        dtau = dbeta = None
        if ctx.needs_input_grad[3] and ctx.tau_like is not None:
            dtau = reduce_to(dtau_bh, ctx.tau_like)
        if ctx.needs_input_grad[4] and ctx.beta_like is not None:
            dbeta = reduce_to(dbeta_bh, ctx.beta_like)
        return dq, dk, dv, dtau, dbeta, None, None


def _differentiable_backward(ctx, grad: torch.Tensor) -> tuple:
    """The gradients when autograd is asked to build their graph (create_graph: a gradient
    penalty, a Hessian-vector product): autograd through the composite (scores,
    elastic_softmax, @ v), whose own backward is differentiable, so that the second order
    is exact, at the composite's O(length^2) memory. A fused kernel's gradient is a constant
    to autograd: its second order would silently be 0."""
    from .composite import elastic_attention_composite

    q, k, v = ctx.saved_tensors[:3]
    tau, beta = ctx.params
    inputs = (q, k, v, tau, beta)
    wanted = [i for i, need in enumerate(ctx.needs_input_grad[:5])
              if need and isinstance(inputs[i], torch.Tensor)]
    with torch.enable_grad():
        out = elastic_attention_composite(q, k, v, tau=tau, beta=beta, scale=ctx.scale,
                                          causal=ctx.causal)
        got = torch.autograd.grad(out, [inputs[i] for i in wanted], grad, create_graph=True,
                                  allow_unused=True)
    grads: list[torch.Tensor | None] = [None] * 7
    for i, g in zip(wanted, got, strict=True):
        grads[i] = g if g is not None else torch.zeros_like(inputs[i])
    return tuple(grads)
