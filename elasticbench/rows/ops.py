"""The exp family's rows as torch custom ops, so that torch.compile and torch.export see one
opaque operator (no graph break) and autograd sees its registered gradient, and as an
autograd function with the same forward and backward for eager calls (`along` picks):

    elasticbench::exp_family(x, tau, offset, mask_negative, floor) -> y
    elasticbench::exp_family_backward(x, y, g, tau, offset, mask_negative, floor, params)
        -> (dx, dtau, doffset)

x, y, g are rows last. tau (and offset, when the function has one) is a tensor in x's
working precision: 0-d for one value for every row, or per-row, broadcasting against x with
size 1 in the last dimension (rows.param_layout.as_rows); dtau and doffset come back in that
shape (doffset is empty when there is no offset; both are 0 unless `params`). Each call
runs the implementation `rows.tiers.choose` picks (native C++ on CPU, Triton on CUDA, else
torch).

Second order: when autograd builds the gradient's own graph (create_graph), the gradient
is the torch code's, on tensors that keep their graph, so that it is exact; a fused
kernel's gradient is a constant to autograd (docs/gradients.md section 6).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from ..dispatch import Implementation, traced
from . import native_rows
from .param_layout import Scalar, as_rows, work_dtype
from .spec import ExpSpec
from .tiers import TORCH, choose


def _spec(tau: Scalar, offset: Scalar | None, mask_negative: bool, floor: float) -> ExpSpec:
    return ExpSpec(mask_negative, floor, tau, offset)


def _fit(rows: Tensor | None, like: Scalar | None, tau: Tensor) -> Tensor:
    """A parameter's gradient (per row (..., 1), or a total of shape (1,)) summed to like's
    shape; empty (as tau) where there is no such parameter."""
    if not isinstance(like, Tensor):
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


def _gradients(ctx, grad: Tensor, tau: Scalar, offset: Scalar | None,
               backward: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> tuple:
    """The autograd backward of both paths: `backward(x, y, g, tau, offset, params)` runs the
    implementation, unless autograd builds the gradient's graph (create_graph), where the
    differentiable torch code runs instead."""
    x, y = ctx.saved_tensors[:2]
    need_tau, need_offset = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    params = need_tau or need_offset
    if torch.is_grad_enabled():  # create_graph: the differentiable torch code
        spec = _spec(tau, offset, ctx.mask_negative, ctx.floor)
        dx, dtau, doffset = TORCH.backward(x, y, grad, spec, params)
        dtau = _fit(dtau, tau, tau) if need_tau else None
        doffset = _fit(doffset, offset, tau) if need_offset else None
    else:
        dx, dtau, doffset = backward(x, y, grad.contiguous(), tau, offset, params)
    return (dx, dtau if need_tau else None, doffset if need_offset else None, None, None)


def _backward(ctx, grad: Tensor):
    tau, offset = ctx.saved_tensors[2:]
    return _gradients(ctx, grad, tau, offset, lambda x, y, g, t, o, params: exp_family_backward(
        x, y, g, t, o, ctx.mask_negative, ctx.floor, params))


exp_family.register_autograd(_backward, setup_context=_setup_context)


class _ExpFamily(torch.autograd.Function):
    """The eager path: the custom op's forward and backward without its dispatch (a fraction
    of its per-call cost). tau and offset may stay Python floats here (no tensor is made
    for them, and none is copied to a device); the caller chooses the implementation, and the
    backward runs the forward's. (On CPU tensors the native tier's own C++ autograd function,
    exp_rows, serves instead: `along`.)"""

    @staticmethod
    def forward(ctx, x: Tensor, tau: Scalar, offset: Scalar | None, mask_negative: bool,
                floor: float, impl: Implementation) -> Tensor:
        y = impl.forward(x, _spec(tau, offset, mask_negative, floor)).contiguous()
        tensors = [v for v in (tau, offset) if isinstance(v, Tensor)]
        ctx.save_for_backward(x, y, *tensors)
        ctx.impl, ctx.mask_negative, ctx.floor = impl, mask_negative, floor
        ctx.params = tuple(isinstance(v, Tensor) for v in (tau, offset))
        ctx.values = tuple(None if isinstance(v, Tensor) else v for v in (tau, offset))
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        saved = iter(ctx.saved_tensors[2:])
        tau, offset = (next(saved) if is_tensor else value
                       for is_tensor, value in zip(ctx.params, ctx.values, strict=True))

        def run(x, y, g, t, o, params):
            spec = _spec(t, o, ctx.mask_negative, ctx.floor)
            dx, dt, do = ctx.impl.backward(x, y, g, spec, params)
            return dx, _fit(dt, t, x) if ctx.needs_input_grad[1] else None, \
                _fit(do, o, x) if ctx.needs_input_grad[2] else None

        return (*_gradients(ctx, grad, tau, offset, run), None)


def rows_param(value: float | Tensor | None, x: Tensor, dim: int, dtype: torch.dtype
               ) -> Tensor | None:
    """tau or offset as the ops take it: a 0-d tensor for a float, a tensor laid out per row
    (keeping its autograd graph) for a tensor; None stays None."""
    if value is None:
        return None
    if not isinstance(value, Tensor):  # filled on the device: no copy from the host
        return torch.full((), float(value), dtype=dtype, device=x.device)
    out = as_rows(value, x, dim, dtype, keep_graph=True)
    assert isinstance(out, Tensor)
    return out



def along(x: Tensor, tau: float | Tensor, offset: float | Tensor | None, dim: int,
          spec: ExpSpec) -> Tensor:
    """The exp family (spec's mask and floor) of x along dim, differentiable in x and in tau
    and the offset where they are tensors: through the custom op where the call is traced
    (elasticbench.dispatch.traced), else through the autograd function, or straight to the
    implementation where autograd has nothing to record."""
    wd = work_dtype(x.dtype)
    last = dim == x.ndim - 1 or x.ndim == 0
    rows = x if last else x.movedim(dim, -1)
    if traced(x):
        y = exp_family(rows, rows_param(tau, x, dim, wd), rows_param(offset, x, dim, wd),
                       spec.mask_negative, spec.floor)
        return y if last else y.movedim(-1, dim)
    t, o = as_rows(tau, x, dim, wd, keep_graph=True), as_rows(offset, x, dim, wd, keep_graph=True)
    call = _spec(t, o, spec.mask_negative, spec.floor)
    impl = choose(rows, call)
    if not (torch.is_grad_enabled() and any(isinstance(v, Tensor) and v.requires_grad
                                            for v in (x, t, o))):
        y = impl.forward(rows, call)
    elif impl is native_rows.CPP and rows.ndim:
        (tt, tv), (ot, ov) = _tensor_or_value(t), _tensor_or_value(o)
        y = _native_rows().exp_rows(rows, tt, ot, tv, ov, spec.mask_negative, spec.floor)
    else:
        y = _ExpFamily.apply(rows, t, o, spec.mask_negative, spec.floor, impl)
    return y if last else y.movedim(-1, dim)


def _tensor_or_value(v: Scalar | None) -> tuple[Tensor | None, float]:
    return (v, 0.0) if isinstance(v, Tensor) else (None, 0.0 if v is None else float(v))


@functools.cache
def _native_rows():
    """The native tier with its autograd function's create_graph path set (exp_rows: one C++
    autograd node per call, forward and backward the native kernels)."""
    ext = native_rows.extension()
    ext.set_differentiable_rows_backward(_differentiable_rows_backward)
    return ext


def _differentiable_rows_backward(x: Tensor, y: Tensor, g: Tensor, tau: Tensor | None,
                                  offset: Tensor | None, tau_value: float, offset_value: float,
                                  mask_negative: bool, floor: float, need_tau: bool,
                                  need_offset: bool) -> tuple:
    """exp_rows's backward where autograd builds the gradient's graph: the torch code."""
    t = tau if tau is not None else tau_value
    o = offset if offset is not None else offset_value
    dx, dt, do = TORCH.backward(x, y, g, _spec(t, o, mask_negative, floor),
                                need_tau or need_offset)
    return (dx, _fit(dt, t, x) if need_tau else None, _fit(do, o, x) if need_offset else None)
