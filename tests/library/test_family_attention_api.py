"""softmax1, symax, stablemax and sigmoid attention (elasticbench.functional, elasticbench.nn)
against plain torch definitions written here in fp64, on the tiled torch code (and on the
native kernel where it takes the weight): values, gradients, masks, causal alignment,
special values and the modules' parameters (docs/attention.md section 9)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from elasticbench import dispatch, settings
from elasticbench import functional as F
from elasticbench import nn as enn
from elasticbench.attention import autograd, flash, native_attention
from elasticbench.attention.weights import Weight

F64 = torch.float64
NAMES = ("softmax1", "symax", "stablemax", "sigmoid")
WEIGHT = {"softmax1": Weight.SOFTMAX1, "symax": Weight.SYMAX, "stablemax": Weight.STABLEMAX,
          "sigmoid": Weight.SIGMOID}
PARAM = {"symax": "eta", "sigmoid": "bias"}  # the learnable parameter of each, if any


@pytest.fixture(autouse=True)
def _forget_the_implementation_read() -> Iterator[None]:
    yield  # the settings keep $ELASTICBENCH_IMPLEMENTATION once read; tests here change it
    settings.refresh()


def _fn(name: str):
    return getattr(F, f"{name}_attention")


def definition(name: str, q, k, v, *, eta=1.0, bias=None, scale=None, causal=False,
               mask=None):
    """The function as written in its paper, materialized in fp64: mask is a bool
    (B, H, Lq, Lk)-broadcastable tensor, True where the key takes part."""
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    lq, lk = s.shape[-2:]
    hidden = torch.zeros(lq, lk, dtype=torch.bool)
    if causal:
        hidden = torch.ones(lq, lk, dtype=torch.bool).triu(1)
    if mask is not None:
        hidden = hidden | ~mask
    hidden = hidden.expand(s.shape)
    s = s.masked_fill(hidden, 0.0)

    def per_head(p):
        return p.reshape(1, -1, 1, 1) if isinstance(p, torch.Tensor) else p
    if name == "softmax1":
        e = torch.exp(s).masked_fill(hidden, 0)
        w = e / (1 + e.sum(-1, keepdim=True))
    elif name == "symax":
        a = s.abs().masked_fill(hidden, 0)
        w = a / (per_head(eta) + a.sum(-1, keepdim=True))
    elif name == "stablemax":
        st = torch.where(s >= 0, s.clamp_min(0) + 1, 1 / (1 - s.clamp_max(0)))
        a = st.masked_fill(hidden, 0)
        den = a.sum(-1, keepdim=True)
        w = torch.where(den > 0, a / den.clamp_min(1e-300), 0)
    else:
        b = -math.log(lk) if bias is None else per_head(bias)
        w = torch.sigmoid(s + b).masked_fill(hidden, 0)
    return w @ v


def _params(name: str, heads: int, grad: bool = True) -> dict:
    """Per-head parameters, one distinct value per head, as differentiable tensors."""
    if name == "symax":
        return {"eta": torch.linspace(0.3, 2.0, heads, dtype=F64).requires_grad_(grad)}
    if name == "sigmoid":
        return {"bias": torch.linspace(-2.0, 0.5, heads, dtype=F64).requires_grad_(grad)}
    return {}


def _qkv(lq, lk, d=8, b=2, h=3, dtype=F64, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_(grad)
            for n in (lq, lk, lk)]


def _grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, inputs, g)


@pytest.fixture(params=[autograd.TORCH, autograd.CPP], ids=lambda i: i.name)
def impl(request, monkeypatch):
    """Tiles smaller than the inputs (several blocks each way), on the tiled torch code and
    on the native kernel; the test names the weight it needs (`need`)."""
    chosen = request.param
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, chosen.name)
    settings.refresh()  # the variable is read once: read it again
    for module in (flash, native_attention):
        monkeypatch.setattr(module, "BLOCK_Q", 3)
        monkeypatch.setattr(module, "BLOCK_K", 2)
    monkeypatch.setattr(flash, "FAMILY_BLOCK_Q", 3)
    monkeypatch.setattr(flash, "FAMILY_BLOCK_K", 2)

    def need(name: str) -> None:
        if not chosen.accepts(torch.zeros(1), WEIGHT[name]):
            pytest.skip(f"{chosen.name} does not run {name} attention here")
    return need


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("lq", "lk", "causal"), [(7, 7, False), (7, 7, True), (4, 9, True),
                                                  (9, 4, True)])
def test_matches_the_definition_values_and_gradients(impl, name, lq, lk, causal):
    impl(name)
    q, k, v = _qkv(lq, lk)
    p = _params(name, 3)
    out = _fn(name)(q, k, v, causal=causal, **p)
    want = definition(name, q, k, v, causal=causal, **p)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-13)
    inputs = (q, k, v, *p.values())
    for a, b in zip(_grads(out, inputs), _grads(want, inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_key_padding_stays_fused_and_other_masks_match_the_definition(impl, name):
    impl(name)
    q, k, v = _qkv(5, 6)
    p = _params(name, 3)
    pad = torch.tensor([[True, True, False, True, False, True],
                        [False] * 6])[:, None, None, :]  # the second batch sees no key
    out = _fn(name)(q, k, v, attn_mask=pad, causal=True, **p)
    want = definition(name, q, k, v, mask=pad, causal=True, **p)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-13)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    inputs = (q, k, v, *p.values())
    for a, b in zip(_grads(out, inputs), _grads(want, inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
    per_query = torch.rand(5, 6, generator=torch.Generator().manual_seed(3)) > 0.4
    out = _fn(name)(q, k, v, attn_mask=per_query, **p)
    torch.testing.assert_close(out, definition(name, q, k, v, mask=per_query, **p),
                               rtol=1e-12, atol=1e-13)
    with torch.no_grad():  # a NaN in a padded key does not exist for anyone
        k[0, :, 2] = math.nan
    torch.testing.assert_close(_fn(name)(q, k, v, attn_mask=pad, causal=True, **p),
                               want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_of_the_tiled_torch_code(monkeypatch, name):
    """On the torch code only: the native kernel's gradients are checked against the
    definition above, and gradcheck's hundred tiny calls cost seconds there."""
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, "torch")
    settings.refresh()  # the variable is read once: read it again
    monkeypatch.setattr(flash, "FAMILY_BLOCK_Q", 2)
    monkeypatch.setattr(flash, "FAMILY_BLOCK_K", 3)
    q, k, v = _qkv(3, 4, d=3, b=1, h=2)
    p = _params(name, 2)
    keys = list(p)

    def fn(q, k, v, *ps):
        return _fn(name)(q, k, v, causal=True, **dict(zip(keys, ps, strict=True)))
    assert torch.autograd.gradcheck(fn, (q, k, v, *p.values()))


@pytest.mark.parametrize("name", NAMES)
def test_second_order_through_create_graph_is_the_definitions(name):
    q, k, v = _qkv(4, 5, d=3, b=1, h=2)
    p = _params(name, 2)
    inputs = (q, k, v, *p.values())
    hv = []
    for f in (_fn(name), lambda *a, **kw: definition(name, *a, **kw)):
        out = f(q, k, v, causal=True, **p)
        g = torch.autograd.grad(out.pow(2).sum(), inputs, create_graph=True)
        hv.append(torch.autograd.grad(sum(x.pow(2).sum() for x in g), inputs))
    for a, b in zip(*hv, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_nan_in_a_query_makes_exactly_its_output_nan(impl, name):
    impl(name)
    q, k, v = _qkv(5, 5, b=1, h=1, grad=False)
    q[0, 0, 1, 3] = math.nan
    out = _fn(name)(q, k, v)
    assert out[0, 0, 1].isnan().all() and not out[0, 0, [0, 2, 3, 4]].isnan().any()
    q, k, v = _qkv(5, 5, b=1, h=1, grad=False)
    k[0, 0, 3, 0] = math.nan  # seen by queries 3 and 4 only, causally
    out = _fn(name)(q, k, v, causal=True)
    assert out[0, 0, 3:].isnan().all() and not out[0, 0, :3].isnan().any()


@pytest.mark.parametrize("name", NAMES)
def test_an_infinite_score_takes_the_limit_and_its_gradients(impl, name):
    """Query 1 scores +inf at keys 0, 2, 4 and -inf at the others: the normalized weights
    share 1 over the infinite weights (symax's |-inf| too), sigmoid gives those keys 1 each
    and the -inf ones 0. dq of that query is 0; dv gets its share of dO."""
    impl(name)
    q, k, v = _qkv(3, 6, b=1, h=1, d=2)
    with torch.no_grad():
        q[0, 0, 1] = torch.tensor([math.inf, 0.0])
        k[0, 0, :, 0] = torch.tensor([1.0, -1.0, 2.0, -3.0, 0.5, -0.5])
        k[0, 0, :, 1] = 1.0
    out = _fn(name)(q, k, v)
    hits = list(range(6)) if name == "symax" else [0, 2, 4]
    want = v[0, 0, hits].sum(0) * (1 if name == "sigmoid" else 1 / len(hits))
    torch.testing.assert_close(out[0, 0, 1], want.detach(), rtol=1e-15, atol=0)
    assert out[0, 0, [0, 2]].isfinite().all()
    dout = torch.zeros_like(out)
    dout[0, 0, 1] = torch.tensor([0.5, -2.0], dtype=F64)
    dq, dv = torch.autograd.grad(out, (q, v), dout)
    assert torch.equal(dq[0, 0, 1], torch.zeros(2, dtype=F64))
    share = torch.zeros(6, 1, dtype=F64)
    share[hits] = 1 if name == "sigmoid" else 1 / len(hits)
    torch.testing.assert_close(dv[0, 0], share * dout[0, 0, 1], rtol=1e-15, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_empty_queries_and_keys(name):
    for lq, lk in ((0, 4), (3, 0)):
        q, k, v = _qkv(lq, lk, d=2, b=1, h=2)
        out = _fn(name)(q, k, v, causal=lq == 0)
        assert out.shape == (1, 2, lq, 2)
        assert torch.equal(out, torch.zeros_like(out))
        for g, x in zip(_grads(out, (q, k, v)), (q, k, v), strict=True):
            assert torch.equal(g, torch.zeros_like(x))


@pytest.mark.parametrize("shape", [(), (1,), (2, 3, 1, 1), (3, 1, 1)])
@pytest.mark.parametrize("name", ["symax", "sigmoid"])
def test_every_parameter_layout_is_the_same_function_and_gets_its_gradient(name, shape):
    """A 0-d, (1,), (B, H, 1, 1) or (H, 1, 1) eta or bias: the values a (B, H) grid of them
    gives, and a gradient of the parameter's own shape (summed over what it covers)."""
    q, k, v = _qkv(4, 5)
    base = 0.6 if name == "symax" else -0.8
    p = torch.full(shape, base, dtype=F64) + 0.1 * torch.arange(
        math.prod(shape), dtype=F64).reshape(shape)
    p.requires_grad_()
    out = _fn(name)(q, k, v, **{PARAM[name]: p})
    grid = p.detach().expand(2, 3, 1, 1) if p.ndim == 4 or p.ndim == 3 else (
        p.detach().reshape(1, 1, 1, 1).expand(2, 3, 1, 1))
    rows = [definition(name, q[b:b + 1], k[b:b + 1], v[b:b + 1],
                       **{PARAM[name]: grid[b, :, 0, 0]}) for b in range(2)]
    torch.testing.assert_close(out, torch.cat(rows), rtol=1e-12, atol=1e-13)
    (grad,) = torch.autograd.grad(out.sum(), p)
    assert grad.shape == p.shape and grad.isfinite().all() and (grad != 0).all()


def test_symax_with_eta_zero_and_zero_scores_gives_zeros():
    q, k, v = _qkv(2, 3, b=1, h=1, d=2, grad=False)
    q[0, 0, 0] = 0.0  # every score of query 0 is 0: 0 / (0 + 0) is 0
    out = F.symax_attention(q, k, v, eta=0.0)
    assert torch.equal(out[0, 0, 0], torch.zeros(2, dtype=F64))
    torch.testing.assert_close(out, definition("symax", q, k, v, eta=0.0).nan_to_num(0.0))


@pytest.mark.parametrize("name", ["symax", "stablemax"])
def test_a_sum_that_overflows_gives_nan_not_a_made_up_value(monkeypatch, name):
    """fp32 scores of 3e38 at three keys: each weight is finite, their sum is not."""
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, "torch")
    settings.refresh()  # the variable is read once: read it again
    q, k = torch.ones(1, 1, 2, 1), torch.full((1, 1, 3, 1), 3e38)
    v = torch.randn(1, 1, 3, 2, generator=torch.Generator().manual_seed(0))
    assert _fn(name)(q, k, v, scale=1.0).isnan().all()


def test_sigmoid_bias_defaults_to_minus_log_of_the_keys():
    q, k, v = _qkv(4, 6, grad=False)
    torch.testing.assert_close(F.sigmoid_attention(q, k, v),
                               F.sigmoid_attention(q, k, v, bias=-math.log(6)),
                               rtol=0, atol=0)
    torch.testing.assert_close(F.sigmoid_attention(q, k, v, bias=0.0),
                               definition("sigmoid", q, k, v, bias=0.0), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs_compute_in_fp32(name, dtype):
    q, k, v = _qkv(6, 6, dtype=dtype, grad=False)
    ours = _fn(name)(q, k, v)
    want = _fn(name)(q.double(), k.double(), v.double())
    assert ours.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(ours.double(), want, rtol=2 * eps, atol=2 * eps)


def test_bad_parameters_are_one_clear_error():
    q = k = v = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="eta"):
        F.symax_attention(q, k, v, eta=-1.0)
    with pytest.raises(ValueError, match="bias"):
        F.sigmoid_attention(q, k, v, bias=math.inf)
    with pytest.raises(ValueError, match="does not broadcast"):
        F.symax_attention(q, k, v, eta=torch.ones(3))
    with pytest.raises(ValueError, match="head_dim"):
        F.stablemax_attention(q, k[..., :2], v)
    with pytest.raises(ValueError, match="eta"):
        enn.SymaxAttention(eta=0.0)


def test_the_custom_op_takes_the_weight():
    """The op that traced calls (torch.compile, export) go through: its weight argument
    picks the function, and its autograd gives the tiled backward's gradients."""
    q, k, v = _qkv(4, 5, b=1, h=2)
    eta = torch.full((1, 2), 0.5, dtype=F64, requires_grad=True)
    zero = torch.zeros(1, 2, dtype=F64)
    out = torch.ops.elasticbench.attention(q, k, v, zero, eta, 0.4, True, None,
                                           int(Weight.SYMAX))[0]
    want = definition("symax", q, k, v, eta=eta[0], scale=0.4, causal=True)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-13)
    for a, b in zip(_grads(out, (q, eta)), _grads(want, (q, eta)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize(("module", "name"), [(enn.Softmax1Attention, "softmax1"),
                                              (enn.StablemaxAttention, "stablemax")])
def test_parameterless_modules_are_the_functions(module, name):
    q, k, v = _qkv(5, 5, dtype=torch.float32, grad=False)
    assert torch.equal(module(causal=True)(q, k, v), _fn(name)(q, k, v, causal=True))


def test_symax_module_is_exact_at_init_and_one_step_moves_eta_per_head():
    m = enn.SymaxAttention(eta=0.7, param_shape=(3,), causal=True)
    q, k, v = _qkv(5, 5, dtype=torch.float32, grad=False)
    want = F.symax_attention(q, k, v, eta=torch.full((3,), 0.7), causal=True)
    assert torch.equal(m(q, k, v), want)
    before = m.eta.detach().clone()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m(q, k, v).pow(2).sum().backward()
    assert m.log_eta_scale.grad.shape == (3,) and (m.log_eta_scale.grad != 0).all()
    opt.step()
    assert (m.eta.detach() != before).all() and (m.eta > 0).all()


def test_sigmoid_module_defaults_to_minus_log_keys_and_one_step_moves_the_bias():
    m = enn.SigmoidAttention(param_shape=(3,))
    q, k, v = _qkv(5, 7, dtype=torch.float32, grad=False)
    assert torch.equal(m(q, k, v), F.sigmoid_attention(q, k, v))
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m(q, k, v).sum().backward()
    opt.step()
    moved = m.bias(7).detach() - (-math.log(7))
    assert (moved != 0).all()
    fixed = enn.SigmoidAttention(bias=-1.5, learnable=False)
    assert not list(fixed.parameters())
    assert torch.equal(fixed(q, k, v), F.sigmoid_attention(q, k, v, bias=-1.5))


@pytest.mark.ci
@pytest.mark.parametrize("name", NAMES)
def test_opcheck_of_the_custom_op_with_each_weight(name):
    """torch.library.opcheck (schema, autograd registration, fake tensor, AOT dispatch) on
    the op that torch.compile and torch.export see, with each weight."""
    q, k, v = _qkv(3, 5, d=4, b=1, h=2)
    p_score = torch.full((1, 2), -0.5, dtype=F64, requires_grad=True)
    p_den = torch.full((1, 2), 0.7, dtype=F64, requires_grad=True)
    torch.library.opcheck(torch.ops.elasticbench.attention.default,
                          (q, k, v, p_score, p_den, 0.5, True, None, int(WEIGHT[name])))


@pytest.mark.needs("gpu")
@pytest.mark.parametrize("impl_name", ["torch", "auto"])
@pytest.mark.parametrize("name", NAMES)
def test_cuda_tensors_give_the_cpu_values_and_gradients(monkeypatch, name, impl_name):
    """The same code on CUDA tensors (the tiled torch code, and whatever the dispatch picks
    there: the Triton kernel where it takes the weight), fp32 against the CPU's fp64."""
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, impl_name)
    settings.refresh()  # the variable is read once: read it again
    q, k, v = _qkv(70, 90, d=16, dtype=torch.float32)
    p = {n: t.float() for n, t in _params(name, 3, grad=False).items()}
    dev = [t.detach().cuda().requires_grad_() for t in (q, k, v)]
    out = _fn(name)(*dev, causal=True, **{n: t.cuda() for n, t in p.items()})
    want = _fn(name)(*(t.detach().double().requires_grad_() for t in (q, k, v)), causal=True,
                     **{n: t.double() for n, t in p.items()})
    torch.testing.assert_close(out.double().cpu(), want, rtol=1e-5, atol=1e-5)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad(out, dev, dout.cuda())
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(_fn(name)(*ref_in, causal=True,
                                        **{n: t.double() for n, t in p.items()}),
                              ref_in, dout.double())
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a.double().cpu(), b, rtol=1e-4, atol=1e-4)
