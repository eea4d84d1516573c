"""Host work per attention call (docs/attention.md section 7): the parameters reach the
implementation as views of the caller's tensors (no kernel forms a (batch, heads) copy), a
float as one cached tensor, and the incoming gradient dO in autograd's own layout (no
contiguous copy); the native kernel reads the broadcast (stride-0) parameters right."""

from __future__ import annotations

import pytest
import torch

from elasticbench import dispatch
from elasticbench.attention import autograd, flash
from elasticbench.attention.autograd import bh_params
from elasticbench.dispatch import Implementation
from elasticbench.functional import elastic_attention, sigmoid_attention, symax_attention

B, H = 2, 3


def _ops_run(fn) -> list[str]:
    """The aten ops fn runs (torch's profiler, CPU)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events()]


@pytest.mark.parametrize("shape", [(), (H,), (1,), (H, 1, 1), (B, H, 1, 1), (1, H, 1, 1),
                                   (B, 1, 1, 1)])
def test_a_tensor_parameter_is_a_view_of_the_callers_memory(shape) -> None:
    """Each accepted layout comes back (batch, heads) over the caller's storage, stride 0
    where broadcast, with no copy, fill or other kernel."""
    q = torch.zeros(B, H, 4, 8)
    tau = torch.rand(shape) + 0.5
    out = bh_params(tau, q)
    assert out.shape == (B, H) and out.data_ptr() == tau.data_ptr()
    want = tau.reshape(-1, 1, 1) if tau.ndim == 1 else tau
    torch.testing.assert_close(out, torch.broadcast_to(want.reshape(
        (1,) * (4 - want.ndim) + tuple(want.shape)), (B, H, 1, 1))[:, :, 0, 0],
        atol=0, rtol=0)
    ops = _ops_run(lambda: bh_params(tau, q))
    assert not [o for o in ops if o in ("aten::copy_", "aten::fill_", "aten::clone",
                                          "aten::contiguous", "aten::full", "aten::empty")]


def test_a_float_parameter_is_one_cached_tensor() -> None:
    q = torch.zeros(B, H, 4, 8)
    first, again = bh_params(0.25, q), bh_params(0.25, q)
    assert first.data_ptr() == again.data_ptr() and first.stride() == (0, 0)
    assert torch.equal(first, torch.full((B, H), 0.25))
    assert not [o for o in _ops_run(lambda: bh_params(0.25, q))
                if o in ("aten::copy_", "aten::fill_", "aten::full", "aten::empty")]
    assert bh_params(0.25, q.double()).dtype == torch.float64  # per dtype


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple]]:
    """The tiled torch implementation, recording what its forward and backward receive."""
    calls: list[tuple[str, tuple]] = []

    def fwd(*args, **kw):
        calls.append(("forward", args))
        return flash.forward(*args, **kw)

    def bwd(*args, **kw):
        calls.append(("backward", args))
        return flash.backward(*args, **kw)

    impl = Implementation("recorded", lambda q, weight=0: True, fwd, bwd)
    monkeypatch.setattr(autograd, "choose", lambda q, weight=0: impl)
    return calls


def test_the_implementation_gets_the_callers_parameters_and_a_strided_grad(recorded) -> None:
    """Through the autograd function: p_score and p_den are the caller's per-head tensors
    (their storage), and dO arrives as autograd made it, here the transposed view of the
    gradient of a (batch, length, heads, dim) output, not a contiguous copy; the gradients are
    right."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, 6, 8, generator=g, requires_grad=True) for _ in "qkv")
    tau = torch.tensor([0.6, 0.9, 1.4], requires_grad=True)
    beta = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)
    out = elastic_attention(q, k, v, tau=tau, beta=beta, causal=True)
    y = out.transpose(1, 2).contiguous()  # (B, L, H, D), as a model's output projection
    (g_y,) = (torch.randn(y.shape, generator=g),)
    grads = torch.autograd.grad(y, (q, k, v, tau, beta), g_y)
    (_, fargs), (_, bargs) = recorded
    assert fargs[3].data_ptr() == tau.data_ptr() and fargs[4].data_ptr() == beta.data_ptr()
    assert fargs[3].stride() == (0, 1)
    do = bargs[4]
    assert not do.is_contiguous() and do.stride() == g_y.transpose(1, 2).stride()
    torch.testing.assert_close(do, g_y.transpose(1, 2), atol=0, rtol=0)
    with dispatch.forcing("torch"):
        ref = torch.autograd.grad(elastic_attention(q, k, v, tau=tau.detach().clone()
                                                    .requires_grad_(), beta=beta, causal=True),
                                  (q, k, v, beta), g_y.transpose(1, 2).contiguous())
    for a, b in zip((grads[0], grads[1], grads[2], grads[4]), ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.needs("native")
@pytest.mark.parametrize("weight_fn", ["elastic", "symax", "sigmoid"])
def test_the_native_kernel_reads_broadcast_parameters_in_place(weight_fn: str) -> None:
    """Per-head, per-batch and per-(batch, head) parameters (stride-0 views) give the
    native kernel the values the tiled torch code gets, forward and backward."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, 7, 8, generator=g) for _ in "qkv")
    per_head = torch.tensor([0.6, 0.9, 1.4])
    per_batch = torch.tensor([0.7, 1.3]).reshape(B, 1, 1, 1)
    per_bh = torch.rand(B, H, 1, 1, generator=g) + 0.5
    for p_score, p_den in ((per_head, per_batch), (per_batch, per_bh), (per_bh, per_head)):
        results = []
        for impl in ("cpp", "torch"):
            leaves = [t.clone().requires_grad_() for t in (q, k, v, p_score, p_den)]
            with dispatch.forcing(impl):
                if weight_fn == "elastic":
                    out = elastic_attention(*leaves[:3], tau=leaves[3], beta=leaves[4],
                                            causal="bottom_right")
                    wrt = leaves
                elif weight_fn == "symax":
                    out = symax_attention(*leaves[:3], eta=leaves[4], causal="bottom_right")
                    wrt = leaves[:3] + leaves[4:]
                else:
                    out = sigmoid_attention(*leaves[:3], bias=leaves[3], causal="bottom_right")
                    wrt = leaves[:4]
            do = torch.ones_like(out)
            results.append((out, *torch.autograd.grad(out, wrt, do)))
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_float_parameter_first_seen_in_inference_mode_still_trains() -> None:
    """The cache is not filled in inference mode, whose tensors autograd may not save: a
    training call after an inference call with the same float works."""
    q = torch.randn(1, 2, 3, 8)
    with torch.inference_mode():
        symax_attention(q, q, q, eta=0.375)
    leaf = q.clone().requires_grad_()
    out = symax_attention(leaf, leaf, leaf, eta=0.375)
    (grad,) = torch.autograd.grad(out.sum(), leaf)
    assert grad.shape == q.shape and torch.isfinite(grad).all()


@pytest.mark.needs("native")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_native_kernel_reads_transposed_views_in_place(dtype) -> None:
    """q, k, v as the transposed views of (batch, length, heads, dim) projections and dO as
    autograd's transposed gradient reach the native kernel without a copy (no aten copy in
    its forward or backward call) and give the contiguous inputs' values."""
    from elasticbench import native
    from elasticbench.attention import native_attention

    g = torch.Generator().manual_seed(5)
    lq, lk, d = 7, 11, 8
    fused = torch.randn(B, lk, 3, H, d, generator=g, dtype=dtype)  # a fused k/v/extra
    q = torch.randn(B, lq, H, d, generator=g, dtype=dtype).transpose(1, 2)
    k, v = fused[:, :, 0].transpose(1, 2), fused[:, :, 1].transpose(1, 2)
    do = torch.randn(B, lq, H, d, generator=g, dtype=dtype).transpose(1, 2)
    p = torch.tensor([0.6, 0.9, 1.4], dtype=dtype).reshape(1, H).expand(B, H)
    assert not any(t.is_contiguous() for t in (q, k, v, do))
    args = (p, p, 0.3, True)
    out, m, den = native_attention.forward(q, k, v, *args, None, 0, 4)
    ext, blocks = native.load(), (native_attention.BLOCK_Q, native_attention.BLOCK_K)
    ops = _ops_run(lambda: ext.attention_forward(q, k, v, *args, *blocks, None, 0, 4))
    ops += _ops_run(lambda: ext.attention_backward(q, k, v, out, do, m, den, *args, *blocks,
                                                   None, 0, 4))
    assert not [o for o in ops if o in ("aten::copy_", "aten::contiguous", "aten::clone")]
    want = native_attention.forward(q.contiguous(), k.contiguous(), v.contiguous(), *args,
                                    None, 0, 4)
    got_b = native_attention.backward(q, k, v, out, do, m, den, *args, None, 0, 4)
    want_b = native_attention.backward(q.contiguous(), k.contiguous(), v.contiguous(), out,
                                       do.contiguous(), m, den, *args, None, 0, 4)
    for a, b in zip((out, m, den, *got_b), (*want, *want_b), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
