"""Elastic attention as torch custom ops, and the choice of implementation.

    elasticbench::attention(q, k, v, tau, beta, scale, causal, key_mask) -> (out, m, den)
    elasticbench::attention_backward(q, k, v, out, dout, m, den, tau, beta, scale, causal,
                                     key_mask) -> (dq, dk, dv, dtau, dbeta)

key_mask is None or a (batch, length_k) bool key-padding mask (True: the key takes part),
which every implementation applies inside its tiled loop.

tau and beta are (batch, heads) tensors in the working precision (bh_params lays a float,
a per-head or a per-(batch, head) parameter out so, keeping its graph). Every
implementation has the contract of `flash` (forward -> (out, m, den), backward from those
row statistics); the first whose `accepts` says yes runs: the fused native kernel on CPU
tensors when it is built, the Triton kernel on CUDA tensors, else the tiled torch code.
The forward saves q, k, v, out, m and den: O(length) beyond the inputs and output. With
create_graph, the gradient comes from autograd through the composite, so that second
orders are exact (docs/gradients.md section 6).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import cpp, flash
from .layout import Scalar, head_params, work_dtype


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
    """tau or beta as a contiguous (batch, heads) tensor in q's working precision, keeping
    the autograd graph of a tensor (its gradient flows back through the layout)."""
    b, h = q.shape[:2]
    wd = work_dtype(q.dtype)
    if not isinstance(value, torch.Tensor):
        return torch.full((b, h), float(value), dtype=wd, device=q.device)
    t = head_params(value, b, h, wd, q.device)
    assert isinstance(t, torch.Tensor)
    return t[:, :, 0, 0].expand(b, h).contiguous()


@torch.library.custom_op("elasticbench::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
              beta: torch.Tensor, scale: float, causal: bool,
              key_mask: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, m, den): the output in q's dtype and each query's two statistics (work dtype),
    by the implementation `choose` picks; tau and beta are (batch, heads)."""
    out, m, den = choose(q).forward(q, k, v, tau, beta, scale, causal, key_mask)
    return out.contiguous(), m.contiguous(), den.contiguous()


@attention.register_fake
def _attention_fake(q, k, v, tau, beta, scale, causal, key_mask=None):
    stats = q.new_empty(q.shape[:3], dtype=tau.dtype)
    return q.new_empty((*q.shape[:3], v.shape[3])), stats, stats.new_empty(stats.shape)


@torch.library.custom_op("elasticbench::attention_backward", mutates_args=())
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       grad: torch.Tensor, m: torch.Tensor, den: torch.Tensor,
                       tau: torch.Tensor, beta: torch.Tensor, scale: float, causal: bool,
                       key_mask: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor]:
    """(dq, dk, dv, dtau, dbeta) from the forward's two statistics; dtau, dbeta per
    (batch, head)."""
    parts = choose(q).backward(q, k, v, out, grad, m, den, tau, beta, scale, causal,
                               key_mask)
    return tuple(p.contiguous() for p in parts)  # type: ignore[return-value]


@attention_backward.register_fake
def _attention_backward_fake(q, k, v, out, grad, m, den, tau, beta, scale, causal,
                             key_mask=None):
    # contiguous, as the real op returns them (empty_like would copy a view's strides)
    return tuple(t.new_empty(t.shape) for t in (q, k, v, tau, beta))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, tau, beta, scale, causal, key_mask = inputs
    out, m, den = output
    ctx.save_for_backward(q, k, v, out, m, den, tau, beta)
    ctx.scale, ctx.causal, ctx.key_mask = scale, causal, key_mask


def _backward(ctx, grad, _grad_m, _grad_den):
    if torch.is_grad_enabled():
        return _differentiable_backward(ctx, grad)
    q, k, v, out, m, den, t, b = ctx.saved_tensors
    dq, dk, dv, dtau, dbeta = attention_backward(q, k, v, out, grad.contiguous(), m, den, t,
                                                 b, ctx.scale, ctx.causal, ctx.key_mask)
    need = ctx.needs_input_grad
    return (dq, dk, dv, dtau if need[3] else None, dbeta if need[4] else None, None, None,
            None)


def _differentiable_backward(ctx, grad: torch.Tensor) -> tuple:
    """The gradients when autograd is asked to build their graph (create_graph: a gradient
    penalty, a Hessian-vector product): autograd through the composite (scores,
    elastic_softmax, @ v), whose own backward is differentiable, so that the second order
    is exact, at the composite's O(length^2) memory. A fused kernel's gradient is a constant
    to autograd: its second order would silently be 0."""
    from .composite import elastic_attention_composite

    q, k, v, _, _, _, t, b = ctx.saved_tensors
    inputs = (q, k, v, t, b)
    wanted = [i for i, need in enumerate(ctx.needs_input_grad[:5]) if need]
    km = ctx.key_mask
    with torch.enable_grad():
        out = elastic_attention_composite(q, k, v, tau=t[:, :, None, None],
                                          beta=b[:, :, None, None], scale=ctx.scale,
                                          causal=ctx.causal,
                                          attn_mask=None if km is None else km[:, None, None])
        got = torch.autograd.grad(out, [inputs[i] for i in wanted], grad, create_graph=True,
                                  allow_unused=True)
    grads: list[torch.Tensor | None] = [None] * 8
    for i, g in zip(wanted, got, strict=True):
        grads[i] = g if g is not None else torch.zeros_like(inputs[i])
    return tuple(grads)


attention.register_autograd(_backward, setup_context=_setup_context)


def elastic_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: Scalar,
                         beta: Scalar, scale: float, causal: bool,
                         key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Elastic attention through the custom op, differentiable in q, k, v, tau and beta;
    key_mask (batch, length_k) bool hides padded keys inside the fused loop."""
    out, _, _ = attention(q, k, v, bh_params(tau, q), bh_params(beta, q), scale, causal,
                          key_mask)
    return out
