"""Elastic attention as torch custom ops, and the choice of implementation.

    elasticbench::attention(q, k, v, tau, beta, scale, causal, key_mask) -> (out, m, den)
    elasticbench::attention_backward(q, k, v, out, dout, m, den, tau, beta, scale, causal,
                                     key_mask) -> (dq, dk, dv, dtau, dbeta)

key_mask is None or a (batch, length_k) bool key-padding mask (True: the key takes part),
which every implementation applies inside its tiled loop.

tau and beta are (batch, heads) tensors in the working precision (bh_params lays a float,
a per-head or a per-(batch, head) parameter out so, keeping its graph). Every
implementation has the contract of `flash` (forward -> (out, m, den), backward from those
row statistics); elasticbench.dispatch picks one per call: the fused native kernel on CPU
tensors when it is built, the Triton kernel (kernels/triton/attention.py) on CUDA tensors,
else the tiled torch code. Eager calls skip the custom ops' dispatch through an autograd
function with the same forward and backward (`elastic_attention_op`). The forward saves q,
k, v, out, m and den: O(length) beyond the inputs and output. With create_graph, the
gradient comes from autograd through the composite, so that second orders are exact
(docs/gradients.md section 6).
"""

from __future__ import annotations

import functools

import torch

from .. import devices, dispatch
from ..dispatch import Implementation
from . import cpp, flash
from .layout import Scalar, head_params, work_dtype

TORCH = Implementation("torch", lambda q: True, flash.forward, flash.backward)
CPP = Implementation("cpp", cpp.accepts, cpp.forward, cpp.backward)


@functools.lru_cache(maxsize=1)
def _triton() -> Implementation | None:
    """The Triton kernel, or None where Triton does not import here."""
    try:
        from ..kernels.triton import attention as kernel
    except ImportError:
        return None

    def accepts(q: torch.Tensor) -> bool:
        return q.dtype in TRITON_DTYPES and (q.is_cuda or (q.device.type == "cpu"
                                                           and devices.triton_interpreted()))

    return Implementation("triton", accepts, kernel.attention_forward, kernel.attention_backward)


TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def implementation(name: str) -> Implementation | None:
    """Attention's implementation called `name`, None where it is not available here."""
    return {"cpp": CPP, "torch": TORCH}.get(name) if name != "triton" else _triton()


def choose(q: torch.Tensor) -> Implementation:
    return dispatch.choose(q.device, implementation, q)


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


def _gradients(ctx, grad: torch.Tensor, backward) -> tuple:
    """The autograd backward of both paths: backward(...) runs the implementation's, with
    attention_backward's arguments, unless autograd builds the gradient's graph."""
    if torch.is_grad_enabled():
        return _differentiable_backward(ctx, grad)
    q, k, v, out, m, den, t, b = ctx.saved_tensors
    dq, dk, dv, dtau, dbeta = backward(q, k, v, out, grad.contiguous(), m, den, t, b,
                                       ctx.scale, ctx.causal, ctx.key_mask)
    need = ctx.needs_input_grad
    return (dq, dk, dv, dtau if need[3] else None, dbeta if need[4] else None, None, None,
            None)


def _backward(ctx, grad, _grad_m, _grad_den):
    return _gradients(ctx, grad, attention_backward)


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


class _Attention(torch.autograd.Function):
    """The eager path: the custom ops' forward and backward without their dispatch; the
    implementation is chosen once, in the forward, and kept for the backward."""

    @staticmethod
    def forward(ctx, q, k, v, tau, beta, scale, causal, key_mask):
        impl = choose(q)
        out, m, den = impl.forward(q, k, v, tau, beta, scale, causal, key_mask)
        ctx.impl = impl
        _setup_context(ctx, (q, k, v, tau, beta, scale, causal, key_mask), (out, m, den))
        ctx.mark_non_differentiable(m, den)
        return out, m, den

    @staticmethod
    def backward(ctx, grad, _grad_m, _grad_den):
        return _gradients(ctx, grad, ctx.impl.backward)


def elastic_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: Scalar,
                         beta: Scalar, scale: float, causal: bool,
                         key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Elastic attention, differentiable in q, k, v, tau and beta, through the custom op
    where the call is traced (elasticbench.dispatch.traced), else the autograd function, or
    straight to the implementation where autograd has nothing to record; key_mask (batch,
    length_k) bool hides padded keys inside the fused loop."""
    t, b = bh_params(tau, q), bh_params(beta, q)
    args = (q, k, v, t, b, scale, causal, key_mask)
    if dispatch.traced(q):
        return attention(*args)[0]
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, t, b)):
        return _Attention.apply(*args)[0]
    return choose(q).forward(*args)[0]
