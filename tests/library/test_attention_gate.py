"""The output gate of every attention function and module (docs/attention.md section 9):
out = attention(q, k, v) * gate, taken in the fused implementations' epilogue, on each CPU
path (the tiled torch code, the native kernel, the composite for other masks); gradients of
q, k, v, the parameters and the gate against autograd through the composite times the gate;
the modules' gate=True; bad gates refused in one line."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from elasticbench import dispatch, settings
from elasticbench import functional as F
from elasticbench import nn as enn
from elasticbench.attention import autograd, composite, flash, native_attention
from elasticbench.attention.weights import Weight

F64 = torch.float64
# each function, its weight and its parameters (tensors per head, so they get gradients)
FUNCTIONS = {
    "elastic": (Weight.ELASTIC, lambda h: {"tau": torch.linspace(0.5, 1.5, h, dtype=F64),
                                           "beta": torch.linspace(0.2, 1.0, h, dtype=F64)}),
    "softmax1": (Weight.SOFTMAX1, lambda h: {}),
    "symax": (Weight.SYMAX, lambda h: {"eta": torch.linspace(0.3, 2.0, h, dtype=F64)}),
    "stablemax": (Weight.STABLEMAX, lambda h: {}),
    "sigmoid": (Weight.SIGMOID, lambda h: {"bias": torch.linspace(-2.0, 0.5, h, dtype=F64)}),
    "cog": (Weight.COG, lambda h: {}),
}
MODULES = [enn.ElasticAttention, enn.Softmax1Attention, enn.SymaxAttention,
           enn.StablemaxAttention, enn.SigmoidAttention, enn.CogAttention]


@pytest.fixture(autouse=True)
def _forget_the_implementation_read() -> Iterator[None]:
    yield
    settings.refresh()


def _fn(name: str):
    return getattr(F, f"{name}_attention")


def _qkv(lq, lk, d=4, b=2, h=3, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_()
            for n in (lq, lk, lk)]


def _gate(q, dv=4, seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*q.shape[:3], dv, generator=g, dtype=q.dtype).requires_grad_()


def _params(name: str, h: int) -> dict:
    return {key: t.requires_grad_() for key, t in FUNCTIONS[name][1](h).items()}


def _reference(name, q, k, v, params, gate, **kw):
    """The composite (plain torch, autograd) times the gate."""
    weight = FUNCTIONS[name][0]
    p = {key: t.reshape(1, -1, 1, 1) for key, t in params.items()}
    scale = q.shape[-1] ** -0.5
    if weight is Weight.ELASTIC:
        out = composite.elastic_attention_composite(q, k, v, tau=p["tau"], beta=p["beta"],
                                                    scale=scale, **kw)
    else:
        out = composite.attention_composite(weight, q, k, v, p_score=p.get("bias", 0.0),
                                            p_den=p.get("eta", 0.0), scale=scale, **kw)
    return out * gate


@pytest.fixture(params=["torch", "cpp", "composite"])
def path(request, monkeypatch):
    """The CPU paths: each fused implementation (tiles smaller than the inputs) and, through
    a per-query mask, the composite."""
    name = request.param
    fused = "torch" if name == "composite" else name
    if not autograd.implementation(fused).accepts(torch.zeros(1), Weight.COG):
        pytest.skip(f"{fused} does not run here")
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, fused)
    settings.refresh()
    monkeypatch.setattr(native_attention, "BLOCK_Q", 3)
    monkeypatch.setattr(native_attention, "BLOCK_K", 2)
    for attr, value in (("BLOCK_Q", 3), ("BLOCK_K", 2), ("FAMILY_BLOCK_Q", 3),
                        ("FAMILY_BLOCK_K", 2)):
        monkeypatch.setattr(flash, attr, value)
    return name


def _mask(path: str):
    if path == "composite":  # per query: the materialized path
        return torch.rand(5, 6, generator=torch.Generator().manual_seed(3)) > 0.3
    return torch.tensor([True, True, False, True, True, True])  # key padding: fused


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_the_gated_output_is_the_ungated_times_the_gate(path, name):
    q, k, v = _qkv(5, 6)
    gate = _gate(q)
    params = _params(name, 3)
    mask = _mask(path)
    out = _fn(name)(q, k, v, attn_mask=mask, causal=True, gate=gate, **params)
    ungated = _fn(name)(q, k, v, attn_mask=mask, causal=True, **params)
    assert torch.equal(out, ungated * gate)  # one product of the same fp64 values


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_gradients_match_autograd_through_the_composite(path, name):
    q, k, v = _qkv(5, 6)
    gate = _gate(q)
    params = _params(name, 3)
    mask = _mask(path)
    out = _fn(name)(q, k, v, attn_mask=mask, causal=True, gate=gate, **params)
    want = _reference(name, q, k, v, params, gate, causal=True,
                      attn_mask=mask if mask.ndim == 2 else mask[None, None, None, :])
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-13)
    inputs = (q, k, v, gate, *params.values())
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    got = torch.autograd.grad(out, inputs, dout)
    for a, b in zip(got, torch.autograd.grad(want, inputs, dout), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("fused", ["torch", "cpp"])
def test_fp32_and_16_bit_gates_round_once(monkeypatch, fused):
    """fp32: the fused epilogue's O * g is the ungated output times the gate, bit for bit;
    fp16: round(O * g) with O in fp32, within one rounding of the fp64 product."""
    if not autograd.implementation(fused).accepts(torch.zeros(1), Weight.COG):
        pytest.skip(f"{fused} does not run here")
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, fused)
    settings.refresh()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q, k, v = (t.detach().to(dtype) for t in _qkv(6, 7))
        gate = _gate(q).detach()
        out = F.cog_attention(q, k, v, causal=True, gate=gate)
        assert out.dtype == dtype
        if dtype == torch.float32:
            assert torch.equal(out, F.cog_attention(q, k, v, causal=True) * gate)
        want = F.cog_attention(q.double(), k.double(), v.double(), causal=True) * gate.double()
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(out.double(), want, rtol=2 * eps, atol=2 * eps)


def test_a_broadcast_gate_gets_its_gradient_in_its_own_shape():
    q, k, v = _qkv(4, 5)
    per_head = torch.rand(1, 3, 1, 4, dtype=F64, requires_grad=True)
    out = F.softmax1_attention(q, k, v, gate=per_head)
    full = per_head.detach().expand(2, 3, 4, 4).clone().requires_grad_()
    ref = F.softmax1_attention(q, k, v, gate=full)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    (g,) = torch.autograd.grad(out.sum(), per_head)
    (g_full,) = torch.autograd.grad(ref.sum(), full)
    assert g.shape == per_head.shape
    torch.testing.assert_close(g, g_full.sum((0, 2), keepdim=True), rtol=1e-13, atol=1e-14)


def test_only_the_gate_needs_a_gradient():
    q, k, v = (t.detach() for t in _qkv(4, 5))
    gate = _gate(q)
    out = F.symax_attention(q, k, v, gate=gate)
    (g,) = torch.autograd.grad(out, gate, torch.ones_like(out))
    torch.testing.assert_close(g, F.symax_attention(q, k, v), rtol=0, atol=0)


def test_the_second_order_with_a_gate_is_exact():
    q, k, v = _qkv(2, 3, d=2, b=1, h=1)
    gate = torch.rand(1, 1, 2, 2, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda q, k, v, g: F.cog_attention(q, k, v, causal=True, gate=g), (q, k, v, gate))


def test_a_gate_of_zero_zeroes_the_output_and_the_gradients_of_q_k_v():
    q, k, v = _qkv(4, 5)
    gate = torch.zeros(2, 3, 4, 4, dtype=F64, requires_grad=True)
    out = F.elastic_attention(q, k, v, tau=1.0, beta=1.0, gate=gate)
    assert torch.equal(out, torch.zeros_like(out))
    grads = torch.autograd.grad(out, (q, k, v, gate), torch.ones_like(out))
    for g in grads[:3]:
        assert torch.equal(g, torch.zeros_like(g))
    torch.testing.assert_close(grads[3], F.elastic_attention(q, k, v, tau=1.0, beta=1.0))


def test_an_infinite_query_is_gated_too():
    """The special pass that finishes a query with an infinite weight multiplies the gate."""
    q, k, v = (t.detach() for t in _qkv(3, 4, d=2, b=1, h=1))
    q[0, 0, 1] = torch.tensor([math.inf, 0.0], dtype=F64)
    k[0, 0, :, 0] = torch.tensor([1.0, -1.0, 2.0, -3.0], dtype=F64)
    gate = torch.rand(1, 1, 3, 2, dtype=F64)
    for name in ("cog", "softmax1"):
        assert torch.equal(_fn(name)(q, k, v, gate=gate), _fn(name)(q, k, v) * gate)


def test_the_custom_op_carries_the_gate():
    q, k, v = _qkv(3, 5, d=4, b=1, h=2)
    gate = torch.rand(1, 2, 3, 4, dtype=F64, requires_grad=True)
    zero = torch.zeros(1, 2, dtype=F64)
    out, _, _, ungated = torch.ops.elasticbench.attention(q, k, v, zero, zero, 0.5, True, None,
                                                          int(Weight.COG), 0, gate)
    assert torch.equal(out, ungated * gate)
    (g,) = torch.autograd.grad(out, gate, torch.ones_like(out))
    assert torch.equal(g, ungated)


@pytest.mark.ci
def test_opcheck_of_the_custom_op_with_a_gate():
    q, k, v = _qkv(3, 5, d=4, b=1, h=2)
    gate = torch.rand(1, 2, 3, 4, dtype=F64, requires_grad=True)
    zero = torch.zeros(1, 2, dtype=F64)
    torch.library.opcheck(torch.ops.elasticbench.attention.default,
                          (q, k, v, zero, zero, 0.5, True, None, int(Weight.COG), 0, gate))


def test_a_bad_gate_is_one_clear_error():
    q, k, v = (t.detach() for t in _qkv(4, 5))
    with pytest.raises(ValueError, match="does not broadcast"):
        F.cog_attention(q, k, v, gate=torch.ones(2, 3, 5, 4, dtype=F64))
    with pytest.raises(TypeError, match="dtype"):
        F.cog_attention(q, k, v, gate=torch.ones(2, 3, 4, 4))
    with pytest.raises(TypeError, match="gate"):
        F.symax_attention(q, k, v, gate=torch.ones(2, 3, 4, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="gate"):
        F.softmax1_attention(q, k, v, gate=0.5)
    with pytest.raises(ValueError, match="heads"):
        enn.CogAttention(gate=True)
    with pytest.raises(ValueError, match="gate takes q"):
        enn.CogAttention(gate=True, heads=2, head_dim=4)(q, k, v)


@pytest.mark.parametrize("cls", MODULES)
def test_a_gated_module_starts_near_the_ungated_one_and_learns_its_gate(cls):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    plain = cls(causal=True)
    gated = cls(causal=True, gate=True, heads=3, head_dim=4)
    assert gated.gate_weight.shape == (3, 4, 4) and gated.gate_bias.shape == (3, 4)
    a, b = plain(q, k, v), gated(q, k, v)
    assert ((b - a).abs() <= 0.02 * a.abs()).all()
    torch.testing.assert_close(b, a * torch.sigmoid(torch.tensor(enn.GATE_BIAS)),
                               rtol=1e-6, atol=1e-7)
    before = gated.gate_weight.detach().clone()
    opt = torch.optim.SGD(gated.parameters(), lr=0.1)
    (gated(q, k, v) - torch.randn(2, 3, 5, 4)).square().sum().backward()
    opt.step()
    assert not torch.equal(gated.gate_weight.detach(), before)
    assert "gate=True" in repr(gated)


def test_a_value_dim_other_than_head_dim():
    q, k = (torch.randn(1, 2, 3, 4) for _ in range(2))
    v = torch.randn(1, 2, 3, 6)
    mod = enn.Softmax1Attention(gate=True, heads=2, head_dim=4, value_dim=6)
    assert mod(q, k, v).shape == (1, 2, 3, 6)
