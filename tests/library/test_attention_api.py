"""elastic_attention and ElasticAttention: the tiled implementation against the composite
and finite differences, SDPA's conventions, and the special queries (docs/attention.md)."""

from __future__ import annotations

import math

import pytest
import torch

from elasticbench import dispatch
from elasticbench.attention import autograd, flash, native_attention
from elasticbench.attention.composite import elastic_attention_composite
from elasticbench.functional import elastic_attention
from elasticbench.nn import ElasticAttention

F64 = torch.float64


@pytest.fixture(params=[autograd.TORCH, autograd.CPP], ids=lambda i: i.name)
def small_tiles(request, monkeypatch):
    """Tiles smaller than the inputs, so the online max and sum cross several blocks; the
    test runs on the tiled torch code and on the native kernel (where it is built)."""
    impl = request.param
    if not impl.accepts(torch.zeros(1)):
        pytest.skip(f"{impl.name} does not run here")
    for module in (flash, native_attention):
        monkeypatch.setattr(module, "BLOCK_Q", 3)
        monkeypatch.setattr(module, "BLOCK_K", 2)
    with dispatch.forcing(impl.name):
        yield


def _qkv(lq, lk, d=8, b=2, h=3, dtype=F64, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_(grad)
            for n in (lq, lk, lk)]


def _grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, inputs, g)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("lq", "lk"), [(7, 7), (4, 9), (9, 4)])
def test_tiled_matches_the_composite_with_per_head_parameters(small_tiles, causal, lq, lk):
    q, k, v = _qkv(lq, lk)
    tau = torch.tensor([0.5, 1.0, 3.0], dtype=F64, requires_grad=True)
    beta = torch.tensor([0.3, 2.0, 0.0], dtype=F64, requires_grad=True)
    args = (q, k, v)
    kw = {"tau": tau, "beta": beta, "causal": causal}
    o1, o2 = elastic_attention(*args, **kw), elastic_attention_composite(*args, **kw)
    torch.testing.assert_close(o1, o2, rtol=1e-13, atol=1e-14)
    for a, b in zip(_grads(o1, (*args, tau, beta)), _grads(o2, (*args, tau, beta)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_gradients_match_finite_differences(small_tiles):
    q, k, v = _qkv(5, 6, d=4, b=1, h=2)
    tau = torch.tensor([0.7, 1.3], dtype=F64, requires_grad=True)
    beta = torch.tensor(0.4, dtype=F64, requires_grad=True)
    fn = lambda q, k, v, t, b: elastic_attention(q, k, v, tau=t, beta=b, causal=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, tau, beta))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("lq", "lk"), [(6, 6), (4, 7), (7, 4)])
def test_positive_scores_beta_zero_tau_one_is_sdpa(causal, lq, lk):
    """With every score > 0, beta = 0 and tau = 1 the weights are softmax: SDPA's scale and
    causal alignment (top-left) must be ours."""
    q, k, v = (t.detach().abs() + 0.1 for t in _qkv(lq, lk))
    ours = elastic_attention(q, k, v, tau=1.0, beta=0.0, causal=causal)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(ours, sdpa, rtol=1e-12, atol=1e-13)


def _negative_scores(lq=4, lk=5):
    """q with negative entries, k with positive ones: every score is negative."""
    q, k, v = _qkv(lq, lk, b=1, h=2)
    with torch.no_grad():
        q.copy_(-q.abs() - 0.1)
        k.copy_(k.abs() + 0.1)
    return q, k, v


@pytest.mark.parametrize("beta", [0.0, 1.0])
@pytest.mark.parametrize("impl", [elastic_attention, elastic_attention_composite])
def test_a_query_that_keeps_no_key_gives_exactly_zero_and_zero_gradients(impl, beta):
    q, k, v = _negative_scores()
    tau = torch.tensor(1.0, dtype=F64, requires_grad=True)
    b = torch.tensor(beta, dtype=F64, requires_grad=True)
    out = impl(q, k, v, tau=tau, beta=b)
    assert torch.equal(out, torch.zeros_like(out))
    for g in _grads(out, (q, k, v, tau, b)):
        assert torch.equal(g, torch.zeros_like(g))
    with torch.no_grad():
        v[0, 0, 2, 1] = math.nan  # kept by no query: the outputs stay exactly 0
        assert torch.equal(impl(q, k, v, tau=tau, beta=b), out)


def test_a_causal_query_whose_only_kept_keys_are_hidden_gives_zero(small_tiles):
    """Query 0 sees key 0 only; its score there is negative, its later scores positive."""
    q, k, v = _qkv(4, 4, b=1, h=1, d=2, grad=False)
    q[0, 0, 0] = torch.tensor([1.0, -1.0])
    k[0, 0] = torch.tensor([[-1.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    for impl in (elastic_attention, elastic_attention_composite):
        causal = impl(q, k, v, tau=1.0, beta=0.0, causal=True)
        assert torch.equal(causal[0, 0, 0], torch.zeros(2, dtype=F64))
        assert (impl(q, k, v, tau=1.0, beta=0.0)[0, 0, 0] != 0).all()


@pytest.mark.parametrize("impl", [elastic_attention, elastic_attention_composite])
def test_nan_in_a_query_or_a_visible_key_makes_exactly_those_outputs_nan(small_tiles, impl):
    q, k, v = _qkv(5, 5, b=1, h=1, grad=False)
    q[0, 0, 1, 3] = math.nan
    out = impl(q, k, v, tau=1.0, beta=1.0)
    assert out[0, 0, 1].isnan().all() and not out[0, 0, [0, 2, 3, 4]].isnan().any()
    q, k, v = _qkv(5, 5, b=1, h=1, grad=False)
    k[0, 0, 3, 0] = math.nan  # seen by queries 3 and 4 only, causally
    out = impl(q, k, v, tau=1.0, beta=1.0, causal=True)
    assert out[0, 0, 3:].isnan().all() and not out[0, 0, :3].isnan().any()


@pytest.mark.parametrize("impl", [elastic_attention, elastic_attention_composite])
def test_an_infinite_score_gives_the_mean_of_its_values(small_tiles, impl):
    q, k, v = _qkv(3, 6, b=1, h=1, d=2, grad=False)
    q[0, 0, 1] = torch.tensor([math.inf, 0.0])
    k[0, 0, :, 0] = torch.tensor([1.0, -1.0, 2.0, -3.0, 0.5, -0.5])  # +inf at keys 0, 2, 4
    k[0, 0, :, 1] = 1.0
    out = impl(q, k, v, tau=0.5, beta=1.0)
    torch.testing.assert_close(out[0, 0, 1], v[0, 0, [0, 2, 4]].mean(0), rtol=1e-15, atol=0)


def test_infinite_score_gradients_flow_to_v_only(small_tiles):
    """dq of the +inf query is 0 and dv gets its share; dk is left out: 0 * inf in
    ds^T @ q is NaN for any matmul (docs/attention.md section 3)."""
    q, k, v = _qkv(3, 4, b=1, h=1, d=2)
    with torch.no_grad():
        q[0, 0, 2] = torch.tensor([math.inf, 0.0])
        k[0, 0, :, 0] = torch.tensor([1.0, 2.0, -1.0, 3.0])
        k[0, 0, :, 1] = 1.0
    args, kw = (q, k, v), {"tau": 1.0, "beta": 1.0}
    g1 = _grads(elastic_attention(*args, **kw), (q, v))
    g2 = _grads(elastic_attention_composite(*args, **kw), (q, v))
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    assert torch.equal(g1[0][0, 0, 2], torch.zeros(2, dtype=F64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs_compute_in_fp32(dtype):
    q, k, v = _qkv(6, 6, dtype=dtype, grad=False)
    ours = elastic_attention(q, k, v, tau=0.5, beta=1.0)
    want = elastic_attention(q.double(), k.double(), v.double(), tau=0.5, beta=1.0)
    assert ours.dtype == dtype
    # one rounding to the format, plus fp32 work that is far below it
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(ours.double(), want, rtol=2 * eps, atol=2 * eps)


@pytest.mark.parametrize(("shapes", "message"), [
    (((1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 3, 4)), "head_dim"),
    (((1, 2, 3, 4), (1, 3, 3, 4), (1, 3, 3, 4)), "batch, heads"),
    (((2, 3, 4), (2, 3, 4), (2, 3, 4)), "batch, heads, length, dim"),
    (((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 6, 4)), "share length"),
])
def test_bad_shapes_are_one_clear_error(shapes, message):
    q, k, v = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        elastic_attention(q, k, v, tau=1.0, beta=1.0)


def test_bad_parameters_are_refused():
    q = k = v = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="tau"):
        elastic_attention(q, k, v, tau=0.0, beta=1.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        elastic_attention(q, k, v, tau=torch.ones(3), beta=1.0)


def test_module_is_exact_at_init_and_learns_per_head_parameters():
    m = ElasticAttention(tau=0.7, beta=0.3, param_shape=(3,), causal=True)
    q, k, v = _qkv(5, 5, dtype=torch.float32, grad=False)
    want = elastic_attention(q, k, v, tau=torch.full((3,), 0.7), beta=torch.full((3,), 0.3),
                             causal=True)
    assert torch.equal(m(q, k, v), want)
    m(q, k, v).pow(2).sum().backward()
    assert m.log_tau_scale.grad.shape == (3,) and (m.log_tau_scale.grad != 0).all()
    assert (m.log_beta_scale.grad != 0).all()
