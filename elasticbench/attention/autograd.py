"""The family's attention as torch custom ops, and the choice of implementation.

    elasticbench::attention(q, k, v, p_score, p_den, scale, causal, key_mask, weight, offset,
                            gate) -> (out, m, den, ungated)
    elasticbench::attention_backward(q, k, v, out, dout, m, den, p_score, p_den, scale,
                                     causal, key_mask, weight, offset)
        -> (dq, dk, dv, dp_score, dp_den)

weight is a `weights.Weight` as an int (Elastic, 0, by default), p_score and p_den its
parameters as weights.py names them (the one each score meets, the one the denominator adds:
tau and beta for Elastic). key_mask is None or a (batch,
length_k) bool key-padding mask (True: the key takes part), which every implementation
applies inside its tiled loop. causal hides key j from query i unless j <= i + offset (0:
top-left, SDPA's is_causal; length_k - length_q: bottom-right, a decode cache's;
docs/attention.md section 1). gate is None or a (batch, heads, length_q, value_dim) tensor
of q's dtype (any strides) that the implementation multiplies into the output in its
epilogue (`weights`' contract); ungated is then the output without it, which the backward
needs, and an empty tensor without a gate. The backward is the ungated one, called with
out = ungated and dout = dY * gate; d gate = dY * ungated.

p_score and p_den are (batch, heads) tensors in the working precision: bh_params lays a
float, a per-head or a per-(batch, head) parameter out so as a view of the caller's tensor
(stride 0 where broadcast), keeping its graph and launching no kernel; every implementation reads it
through its strides (docs/attention.md section 7). The incoming gradient dO reaches the
backward in the layout autograd gives it, strided or not. Every implementation
has the contract of `weights` (forward -> (out, m, den), backward from those row
statistics); elasticbench.dispatch picks one per call among those that accept (q, weight):
the fused native kernel on CPU tensors when it is built, the Triton kernel
(kernels/triton/flash_attention.py) on CUDA tensors, else the tiled torch code, which takes
every weight. Eager calls skip the custom ops' dispatch through an autograd function with the
same forward and backward (`attention_op`); where the native kernel runs the call and there
is no gate, that function is one C++ autograd node of the extension (attention_node: the
same kernels, conversions and special-value finish, bit for bit, without a Python forward,
context and backward per call). The forward saves q, k, v, out, m and den:
O(length) beyond the inputs and output. With create_graph, the gradient comes from autograd
through the composite, so that second orders are exact (docs/gradients.md section 6).
"""

from __future__ import annotations

import functools

import torch

from .. import devices, dispatch
from ..dispatch import Implementation
from . import flash, native_attention, special
from .operands import Scalar, head_params, work_dtype
from .weights import Weight

TORCH = Implementation("torch", lambda q, weight=Weight.ELASTIC: True, flash.forward,
                       flash.backward)
CPP = Implementation("cpp", native_attention.accepts, native_attention.forward,
                     native_attention.backward)


@functools.lru_cache(maxsize=1)
def _triton() -> Implementation | None:
    """The Triton kernel, or None where Triton does not import here."""
    try:
        from ..kernels.triton import flash_attention as kernel
    except ImportError:
        return None

    def accepts(q: torch.Tensor, weight: int = Weight.ELASTIC) -> bool:
        return (weight in kernel.WEIGHTS and q.dtype in TRITON_DTYPES
                and (q.is_cuda or (q.device.type == "cpu" and devices.triton_interpreted())))

    return Implementation("triton", accepts, kernel.attention_forward, kernel.attention_backward)


TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_FIXED = {"cpp": CPP, "torch": TORCH}


def implementation(name: str) -> Implementation | None:
    """Attention's implementation called `name`, None where it is not available here."""
    return _FIXED.get(name) if name != "triton" else _triton()


def choose(q: torch.Tensor, weight: int = Weight.ELASTIC) -> Implementation:
    """The implementation that runs attention of this weight on q (elasticbench.dispatch)."""
    return dispatch.choose(q.device, implementation, q, int(weight))


def bh_params(value: Scalar, q: torch.Tensor) -> torch.Tensor:
    """A parameter (tau, beta, eta, bias) as a (batch, heads) tensor in q's working
    precision, keeping the autograd graph of a tensor (its gradient flows back through the
    layout): a view of the caller's tensor (expand, stride 0 where broadcast), so no kernel
    runs per call unless it is on another device or in another float type; a float as a
    cached 0-d tensor per (value, dtype, device, stream), expanded (made afresh where the call is
    traced, in inference mode, whose tensors autograd may not save later, or while a CUDA
    stream is capturing, whose recorded fill a cached tensor would miss)."""
    b, h = q.shape[:2]
    wd = work_dtype(q.dtype)
    if not isinstance(value, torch.Tensor):
        if (dispatch.traced(q) or torch.is_inference_mode_enabled()
                or (q.is_cuda and torch.cuda.is_current_stream_capturing())):
            return torch.full((b, h), float(value), dtype=wd, device=q.device)
        # per CUDA stream: its fill is ordered before that stream's kernels only
        stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
        return _constant(float(value), wd, q.device, stream, b, h)
    if value.dtype != wd or value.device != q.device:
        value = value.to(device=q.device, dtype=wd)
    fast = _bh_view(value, b, h)
    if fast is not None:
        return fast
    t = head_params(value, b, h, wd, q.device)
    assert isinstance(t, torch.Tensor)
    return t[:, :, 0, 0].expand(b, h)


def _bh_view(t: torch.Tensor, b: int, h: int) -> torch.Tensor | None:
    """The (b, h) view of the common parameter shapes (0-d, (h,), (h, 1, 1), (b|1, h|1, 1,
    1)) as head_params lays them out, without its general broadcast check (a per-call cost
    comparable to a decode step's kernel, docs/attention.md section 7); None for any other
    shape, which head_params checks."""
    shape = tuple(t.shape)
    if len(shape) < 2 and shape in ((), (1,), (h,)):  # one autograd node, not two
        return t.expand(b, h)
    if shape in ((1, 1, 1), (h, 1, 1)):
        return t.reshape(1, -1).expand(b, h)
    if len(shape) == 4 and shape[2:] == (1, 1) and shape[0] in (1, b) and shape[1] in (1, h):
        return t[:, :, 0, 0].expand(b, h)
    return None


@functools.lru_cache(maxsize=256)
def _constant(value: float, dtype: torch.dtype, device: torch.device, stream: int = 0,
              batch: int = 1, heads: int = 1) -> torch.Tensor:
    """A 0-d tensor holding value expanded to (batch, heads), made once per (value, dtype,
    device, CUDA stream: the stream its fill is enqueued on, 0 on the CPU, and shape): the
    view is kept too, as forming it is a fixed cost of every call; never written."""
    return torch.full((), value, dtype=dtype, device=device).expand(batch, heads)


@torch.library.custom_op("elasticbench::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p_score: torch.Tensor,
              p_den: torch.Tensor, scale: float, causal: bool,
              key_mask: torch.Tensor | None = None, weight: int = 0, offset: int = 0,
              gate: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, m, den, ungated): the output in q's dtype (times gate where one is given), each
    query's two statistics (work dtype) and the output without the gate (empty, (0,), when
    there is none), by the implementation `choose` picks; p_score and p_den are (batch,
    heads); causal: query i sees key j iff j <= i + offset."""
    impl = choose(q, weight)
    if gate is None:
        out, m, den = impl.forward(q, k, v, p_score, p_den, scale, causal, key_mask,
                                   weight=weight, offset=offset)
        ungated = out.new_empty(0)
    else:
        out, m, den, ungated = impl.forward(q, k, v, p_score, p_den, scale, causal, key_mask,
                                            weight=weight, offset=offset, gate=gate,
                                            keep_ungated=True)
        ungated = ungated.contiguous()
        if ungated.data_ptr() == out.data_ptr():  # an op's outputs may not alias
            ungated = ungated.clone()
    return out.contiguous(), m.contiguous(), den.contiguous(), ungated


@attention.register_fake
def _attention_fake(q, k, v, p_score, p_den, scale, causal, key_mask=None, weight=0,
                    offset=0, gate=None):
    stats = q.new_empty(q.shape[:3], dtype=work_dtype(q.dtype))
    shape = (*q.shape[:3], v.shape[3])
    return (q.new_empty(shape), stats, stats.new_empty(stats.shape),
            q.new_empty(shape if gate is not None else (0,)))


@torch.library.custom_op("elasticbench::attention_backward", mutates_args=())
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       grad: torch.Tensor, m: torch.Tensor, den: torch.Tensor,
                       p_score: torch.Tensor, p_den: torch.Tensor, scale: float, causal: bool,
                       key_mask: torch.Tensor | None = None, weight: int = 0,
                       offset: int = 0
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor]:
    """(dq, dk, dv, dp_score, dp_den) from the forward's two statistics; dp_score, dp_den
    per (batch, head)."""
    parts = choose(q, weight).backward(q, k, v, out, grad, m, den, p_score, p_den, scale,
                                       causal, key_mask, weight=weight, offset=offset)
    return tuple(p.contiguous() for p in parts)  # type: ignore[return-value]


@attention_backward.register_fake
def _attention_backward_fake(q, k, v, out, grad, m, den, p_score, p_den, scale, causal,
                             key_mask=None, weight=0, offset=0):
    # contiguous, as the real op returns them (empty_like would copy a view's strides)
    return tuple(t.new_empty(t.shape) for t in (q, k, v, p_score, p_den))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, p_score, p_den, scale, causal, key_mask, weight, offset, *rest = inputs
    gate = rest[0] if rest else None
    out, m, den, *kept = output
    ungated = out if gate is None else kept[0]  # the backward is the ungated one's
    ctx.save_for_backward(q, k, v, ungated, m, den, p_score, p_den, gate)
    ctx.scale, ctx.causal, ctx.key_mask, ctx.weight = scale, causal, key_mask, weight
    ctx.offset = offset


def _gradients(ctx, grad: torch.Tensor, backward) -> tuple:
    """The autograd backward of both paths: backward(...) runs the implementation's, with
    attention_backward's arguments, unless autograd builds the gradient's graph. With a
    gate, the ungated backward takes dY * gate, and d gate = dY * ungated."""
    if torch.is_grad_enabled():
        return _differentiable_backward(ctx, grad)
    q, k, v, out, m, den, p_score, p_den, gate = ctx.saved_tensors
    need = ctx.needs_input_grad
    dgate = None
    if gate is not None:
        if len(need) > 10 and need[10]:
            dgate = (grad * out).to(gate.dtype)
        grad = grad * gate
    grads: tuple = (None,) * 5
    if any(need[:5]):
        # grad as autograd gives it: every implementation reads dO through its strides
        grads = backward(q, k, v, out, grad, m, den, p_score, p_den, ctx.scale, ctx.causal,
                         ctx.key_mask, weight=ctx.weight, offset=ctx.offset)
    dq, dk, dv, dp_score, dp_den = grads
    return (dq, dk, dv, dp_score if need[3] else None, dp_den if need[4] else None, None,
            None, None, None, None, dgate)


def _backward(ctx, grad, _grad_m, _grad_den, _grad_ungated):
    return _gradients(ctx, grad, attention_backward)


def _differentiable_backward(ctx, grad: torch.Tensor) -> tuple:
    """The gradients when autograd is asked to build their graph (create_graph: a gradient
    penalty, a Hessian-vector product): autograd through the composite (scores, the weight,
    @ v), whose own backward is differentiable, so that the second order is exact, at the
    composite's O(length^2) memory. A fused kernel's gradient is a constant to autograd:
    its second order would silently be 0."""
    q, k, v, _, _, _, p_score, p_den, gate = ctx.saved_tensors
    return _differentiable(q, k, v, p_score, p_den, gate, ctx.scale, ctx.causal,
                           ctx.key_mask, ctx.weight, ctx.offset, grad,
                           tuple(ctx.needs_input_grad[:5]),
                           gate is not None and ctx.needs_input_grad[10])


def _differentiable(q, k, v, p_score, p_den, gate, scale, causal, key_mask, weight, offset,
                    grad, needs, need_gate) -> tuple:
    """_differentiable_backward's gradients from its operands: (dq, dk, dv, dp_score, dp_den,
    None x 5, d gate), each None where `needs` (five flags) or need_gate does not ask for it."""
    from . import composite

    inputs = (q, k, v, p_score, p_den)
    wanted = [i for i, need in enumerate(needs) if need]
    mask = None if key_mask is None else key_mask[:, None, None]
    with torch.enable_grad():
        p_score4, p_den4 = p_score[:, :, None, None], p_den[:, :, None, None]
        if Weight(weight) is Weight.ELASTIC:  # Elastic's own, as before the family
            out = composite.elastic_attention_composite(
                q, k, v, tau=p_score4, beta=p_den4, scale=scale, causal=causal,
                attn_mask=mask, offset=offset)
        else:
            out = composite.attention_composite(
                Weight(weight), q, k, v, p_score=p_score4, p_den=p_den4, scale=scale,
                causal=causal, attn_mask=mask, offset=offset)
        if gate is not None:
            out = out * gate
        targets = [inputs[i] for i in wanted] + ([gate] if need_gate else [])
        got = torch.autograd.grad(out, targets, grad, create_graph=True, allow_unused=True)
    grads: list[torch.Tensor | None] = [None] * 11
    slots = [*wanted, 10] if need_gate else wanted
    for i, t, g in zip(slots, targets, got, strict=True):
        grads[i] = g if g is not None else torch.zeros_like(t)
    return tuple(grads)


def _node_differentiable(q, k, v, p_score, p_den, scale, causal, key_mask, weight, offset,
                         grad, needs) -> tuple:
    """The native node's backward where autograd builds the gradient's graph: as the
    autograd function's (no gate)."""
    return _differentiable(q, k, v, p_score, p_den, None, scale, causal, key_mask, weight,
                           offset, grad, needs, False)[:5]


@functools.cache
def _native_node():
    """The native extension's attention_node (one C++ autograd node for an eager CPU call
    without a gate), its Python hooks set: special's finish of queries marked m = +inf and
    the create_graph backward."""
    from .. import native

    ext = native.load()
    ext.set_attention_hooks(special.fix_forward, special.fix_backward, _node_differentiable)
    return ext.attention_node


attention.register_autograd(_backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """The eager path: the custom ops' forward and backward without their dispatch; the
    implementation is chosen once, in the forward, and kept for the backward."""

    @staticmethod
    def forward(ctx, q, k, v, p_score, p_den, scale, causal, key_mask, weight, offset, gate):
        impl = choose(q, weight)
        if gate is None:
            out, m, den = impl.forward(q, k, v, p_score, p_den, scale, causal, key_mask,
                                       weight=weight, offset=offset)
            ungated = out
        else:  # the backward needs the ungated output: kept by the epilogue
            out, m, den, ungated = impl.forward(q, k, v, p_score, p_den, scale, causal,
                                                key_mask, weight=weight, offset=offset,
                                                gate=gate, keep_ungated=True)
        ctx.impl = impl
        _setup_context(ctx, (q, k, v, p_score, p_den, scale, causal, key_mask, weight, offset,
                             gate), (out, m, den, ungated))
        ctx.mark_non_differentiable(m, den)
        # m and den take no gradient: left None, not filled with zeros on every backward
        ctx.set_materialize_grads(False)
        return out, m, den

    @staticmethod
    def backward(ctx, grad, _grad_m, _grad_den):
        if grad is None:  # no gradient reached out: zeros, as materialized grads would be
            grad = torch.zeros_like(ctx.saved_tensors[3])
        return _gradients(ctx, grad, ctx.impl.backward)


def attention_op(weight: Weight | int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 p_score: Scalar, p_den: Scalar, scale: float, causal: bool,
                 key_mask: torch.Tensor | None = None, offset: int = 0,
                 gate: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of `weight`, differentiable in q, k, v, p_score, p_den and gate, through the
    custom op where the call is traced (elasticbench.dispatch.traced), else the autograd
    function, or straight to the implementation where autograd has nothing to record;
    key_mask (batch, length_k) bool hides padded keys inside the fused loop; causal: query i
    sees key j iff j <= i + offset (an int; operands.causal_offset); gate None or (batch,
    heads, length_q, value_dim) in q's dtype, multiplied into the output by the
    implementation's epilogue."""
    w = int(weight)
    offset = int(offset) if causal else 0
    p_score, p_den = bh_params(p_score, q), bh_params(p_den, q)
    args = (q, k, v, p_score, p_den, scale, causal, key_mask, w, offset)
    if dispatch.traced(q):
        return attention(*args, gate)[0]
    if torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad or p_score.requires_grad
            or p_den.requires_grad or (gate is not None and gate.requires_grad)):
        if gate is None and choose(q, w) is CPP:  # the same kernels as one C++ node
            return _native_node()(q, k, v, p_score, p_den, scale, causal, key_mask, w,
                                  offset, native_attention.BLOCK_Q, native_attention.BLOCK_K)
        return _Attention.apply(*args, gate)[0]
    impl = choose(q, w)
    if gate is None:
        return impl.forward(*args[:8], weight=w, offset=offset)[0]
    return impl.forward(*args[:8], weight=w, offset=offset, gate=gate)[0]
