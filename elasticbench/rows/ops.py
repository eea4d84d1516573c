"""The exp family's rows as torch custom ops, so that torch.compile and torch.export see one
opaque operator (no graph break) and autograd sees its registered gradient:

    elasticbench::exp_family(x, tau, offset, mask_negative, floor) -> y
    elasticbench::exp_family_backward(x, y, g, tau, offset, mask_negative, floor, params)
        -> (dx, dtau, doffset)

x, y, g are rows last. tau (and offset, when the function has one) is a tensor in x's
working precision: 0-d for one value for every row, or per-row, broadcasting against x with
size 1 in the last dimension (rows.layout.as_rows); dtau and doffset come back in that
shape (doffset is empty when there is no offset; both are 0 unless `params`). Each call
runs the tier `rows.tiers.choose` picks (native C++ on CPU, Triton on CUDA, else torch).

Second order: when autograd builds the gradient's own graph (create_graph), the gradient
is the torch code's, on tensors that keep their graph, so that it is exact; a fused
kernel's gradient is a constant to autograd (docs/gradients.md section 6).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .layout import as_rows, work_dtype
from .tiers import TORCH, ExpSpec, choose


def _spec(tau: Tensor, offset: Tensor | None, mask_negative: bool, floor: float) -> ExpSpec:
    return ExpSpec(mask_negative, floor, tau, offset)


def _fit(rows: Tensor | None, like: Tensor | None, tau: Tensor) -> Tensor:
    """A parameter's gradient (per row (..., 1), or a total of shape (1,)) summed to like's
    shape; empty (as tau) where there is no such parameter."""
    if like is None:
        return tau.new_empty((0,))
    if rows is None:
        return torch.zeros_like(like)
    if like.ndim == 0:
        return rows.sum().to(like.dtype)
    return rows.sum_to_size(like.shape).to(like.dtype)


@torch.library.custom_op("elasticbench::exp_family", mutates_args=())
def exp_family(x: Tensor, tau: Tensor, offset: Tensor | None, mask_negative: bool,
               floor: float) -> Tensor:
    """y over the rows (last dimension) of x; see the module docstring."""
    spec = _spec(tau, offset, mask_negative, floor)
    return choose(x, spec).forward(x, spec).contiguous()


@exp_family.register_fake
def _exp_family_fake(x, tau, offset, mask_negative, floor):
    return x.new_empty(x.shape)


@torch.library.custom_op("elasticbench::exp_family_backward", mutates_args=())
def exp_family_backward(x: Tensor, y: Tensor, g: Tensor, tau: Tensor, offset: Tensor | None,
                        mask_negative: bool, floor: float, params: bool
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """dx, dtau, doffset of the rows of x given the output y and the upstream gradient g."""
    spec = _spec(tau, offset, mask_negative, floor)
    dx, dtau, doffset = choose(x, spec).backward(x, y, g, spec, params)
    return (dx.contiguous(), _fit(dtau, tau, tau).contiguous(),
            _fit(doffset, offset, tau).contiguous())


@exp_family_backward.register_fake
def _exp_family_backward_fake(x, y, g, tau, offset, mask_negative, floor, params):
    # contiguous, as the real op returns them (empty_like would copy a view's strides)
    return (x.new_empty(x.shape), tau.new_empty(tau.shape),
            tau.new_empty((0,) if offset is None else offset.shape))


def _setup_context(ctx, inputs, output) -> None:
    x, tau, offset, mask_negative, floor = inputs
    ctx.save_for_backward(x, output, tau, offset)  # the output: a second order differentiates it
    ctx.mask_negative, ctx.floor = mask_negative, floor


def _backward(ctx, grad: Tensor):
    x, y, tau, offset = ctx.saved_tensors
    need_tau, need_offset = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    params = need_tau or need_offset
    if torch.is_grad_enabled():  # create_graph: the differentiable torch code
        spec = _spec(tau, offset, ctx.mask_negative, ctx.floor)
        dx, dtau, doffset = TORCH.backward(x, y, grad, spec, params)
        dtau, doffset = _fit(dtau, tau, tau), _fit(doffset, offset, tau)
    else:
        dx, dtau, doffset = exp_family_backward(x, y, grad.contiguous(), tau, offset,
                                                ctx.mask_negative, ctx.floor, params)
    return (dx, dtau if need_tau else None, doffset if need_offset else None, None, None)


exp_family.register_autograd(_backward, setup_context=_setup_context)


def rows_param(value: float | Tensor | None, x: Tensor, dim: int, dtype: torch.dtype
               ) -> Tensor | None:
    """tau or offset as the ops take it: a 0-d tensor for a float, a tensor laid out per row
    (keeping its autograd graph) for a tensor; None stays None."""
    if value is None:
        return None
    if not isinstance(value, Tensor):
        return torch.tensor(float(value), dtype=dtype, device=x.device)
    out = as_rows(value, x, dim, dtype, keep_graph=True)
    assert isinstance(out, Tensor)
    return out



def along(x: Tensor, tau: float | Tensor, offset: float | Tensor | None, dim: int,
          spec: ExpSpec) -> Tensor:
    """The exp family (spec's mask and floor) of x along dim through the custom op,
    differentiable in x and in tau and the offset where they are tensors."""
    wd = work_dtype(x.dtype)
    y = exp_family(x.movedim(dim, -1), rows_param(tau, x, dim, wd),
                   rows_param(offset, x, dim, wd), spec.mask_negative, spec.floor)
    return y.movedim(-1, dim)
