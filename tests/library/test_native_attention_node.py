"""The eager CPU attention call as one native autograd node (elasticbench/attention/
autograd.py's attention_op): the same outputs and gradients, bit for bit, as the Python
autograd function it stands in for, with every weight, dtype, causal alignment and key mask; queries with an infinite weight finished by special.py; the
create_graph backward through the composite; and SymaxAttention's eta as one node with the
gradient chain of the four torch ops it replaces."""

from __future__ import annotations

import math

import pytest
import torch

from elasticbench import functional as F
from elasticbench.attention import autograd, native_attention
from elasticbench.attention.autograd import _Attention, bh_params
from elasticbench.attention.weights import Weight
from elasticbench.nn import LOG_SCALE_LIMIT, SymaxAttention, _scale

pytestmark = pytest.mark.needs("native")


def _operands(dtype: torch.dtype, b: int = 2, h: int = 3, lq: int = 6, lk: int = 9,
              d: int = 5, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, h, n, d, generator=gen) * 2).to(dtype) for n in (lq, lk, lk)]


def _both(weight: Weight, q, k, v, p_score, p_den, causal, key_mask, offset, g) -> list[list]:
    """[outputs and gradients] of the node and of the Python autograd function, each from
    fresh leaves."""
    results = []
    for path in ("node", "function"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, p_score, p_den)]
        t, b = bh_params(leaves[3], leaves[0]), bh_params(leaves[4], leaves[0])
        args = (*leaves[:3], t, b, 0.4, causal, key_mask, int(weight), offset if causal else 0)
        if path == "node":
            out = autograd._native_node()(*args, native_attention.BLOCK_Q, native_attention.BLOCK_K)
        else:
            out = _Attention.apply(*args, None)[0]
        results.append([out, *torch.autograd.grad(out, leaves, g)])
    return results


@pytest.mark.parametrize("weight", list(Weight))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_the_node_equals_the_autograd_function_bit_for_bit(weight, dtype, causal,
                                                           masked) -> None:
    q, k, v = _operands(dtype)
    gen = torch.Generator().manual_seed(1)
    wd = torch.float64 if dtype == torch.float64 else torch.float32
    p_score = (torch.rand(3, generator=gen) + 0.5).to(wd)
    p_den = (torch.rand(3, generator=gen) + 0.2).to(wd)
    key_mask = (torch.rand(2, 9, generator=gen) > 0.3) if masked else None
    g = torch.randn(2, 3, 6, 5, generator=gen).to(dtype)
    node, function = _both(weight, q, k, v, p_score, p_den, causal, key_mask, 3, g)
    for a, b in zip(node, function, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_a_query_with_an_infinite_weight_is_finished_as_by_the_function() -> None:
    """special.py's fix runs from the node, forward (the mean of the +inf keys' values)
    and backward (dv gets dO/k at them)."""
    q, k, v = _operands(torch.float32, 1, 2, 3, 4, 2)
    k[0, 0, 1] = math.inf * q[0, 0, 0].sign()  # query 0's score with key 1 is +inf
    k[0, 0, 2] = math.inf * q[0, 0, 0].sign()
    ones = torch.ones(2)
    g = torch.randn(1, 2, 3, 2, generator=torch.Generator().manual_seed(4))
    node, function = _both(Weight.ELASTIC, q, k, v, ones, ones, False, None, 0, g)
    torch.testing.assert_close(node[0][0, 0, 0], (v[0, 0, 1] + v[0, 0, 2]) / 2, atol=0,
                               rtol=0)
    for a, b in zip(node, function, strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())


def test_an_eager_call_runs_the_node_and_keeps_the_python_path_for_a_gate() -> None:
    q, k, v = (t.requires_grad_() for t in _operands(torch.float32))
    out = F.elastic_attention(q, k, v, tau=0.5, beta=1.0)
    assert type(out.grad_fn).__name__ != "_AttentionBackward"
    gated = F.elastic_attention(q, k, v, tau=0.5, beta=1.0, gate=torch.ones(2, 3, 6, 5))
    assert type(gated.grad_fn).__name__ in ("_AttentionBackward", "MulBackward0")


@pytest.mark.parametrize("weight", [Weight.ELASTIC, Weight.SYMAX])
def test_create_graph_gives_the_functions_second_order(weight) -> None:
    """With create_graph the node's backward is autograd through the composite, as the
    autograd function's: the gradient of a gradient penalty is the same."""
    q, k, v = _operands(torch.float64, 1, 2, 4, 5, 3)
    p_score, p_den = torch.tensor([0.7, 1.2], dtype=torch.float64), torch.tensor(
        [0.4, 0.9], dtype=torch.float64)
    results = []
    for path in ("node", "function"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, p_score, p_den)]
        t, b = bh_params(leaves[3], leaves[0]), bh_params(leaves[4], leaves[0])
        args = (*leaves[:3], t, b, 0.5, True, None, int(weight), 0)
        blocks = (native_attention.BLOCK_Q, native_attention.BLOCK_K)
        out = (autograd._native_node()(*args, *blocks) if path == "node"
               else _Attention.apply(*args, None)[0])
        grads = torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
        penalty = sum(g.square().sum() for g in grads)
        results.append(torch.autograd.grad(penalty, leaves))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert all(a.abs().sum() > 0 for a in results[0][:3])  # symax has no use for p_score


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(), (4,)])
def test_eta_is_the_torch_codes_value_and_gradient(dtype, shape) -> None:
    """SymaxAttention.eta on the CPU (one native node) against the torch code's four ops,
    with eta0 != 1 (so the order of the gradient's two products matters) and log-scales
    inside and beyond the clamp."""
    module = SymaxAttention(eta=0.7, param_shape=shape).to(dtype)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        module.log_eta_scale.copy_(torch.randn(module.log_eta_scale.shape, generator=gen))
        if shape:
            module.log_eta_scale[0] = 2 * LOG_SCALE_LIMIT
    eta = module.eta
    g = torch.randn(eta.shape, generator=gen, dtype=dtype)
    (got,) = torch.autograd.grad(eta, module.log_eta_scale, g)
    leaf = module.log_eta_scale.detach().clone().requires_grad_()
    ref = _scale(module.eta0, leaf.reshape(()) if shape == () else leaf)
    (want,) = torch.autograd.grad(ref, leaf, g)
    assert torch.equal(eta, ref) and torch.equal(got, want)
    if shape:
        assert got[0] == 0
