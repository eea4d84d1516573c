"""Second-order gradients (a gradient penalty, gradgradcheck) through elastic_softmax, its
siblings and elastic_attention: the gradient's own gradient is exact on every path, checked
against plain-torch composites that share no code with elasticbench."""

from __future__ import annotations

import math

import pytest
import torch

from elasticbench.functional import elastic_attention, elastic_softmax, softmax, softmax1

F64 = torch.float64


def plain_elastic(s: torch.Tensor, tau: float, beta: float) -> torch.Tensor:
    e = torch.where(s >= 0, torch.exp(s / tau), 0)
    return e / (e.sum(-1, keepdim=True) + beta)


def plain_attention(q, k, v, tau: float, beta: float, causal: bool) -> torch.Tensor:
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        hidden = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)
        s = s.masked_fill(hidden, -math.inf)
    return plain_elastic(s, tau, beta) @ v


def penalty_grad(f, x: torch.Tensor, w: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """d/dw of || d/dx sum(c * f(x @ w)) ||^2: a gradient penalty, a second order in w."""
    w = w.detach().clone().requires_grad_(True)
    xx = x.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad((c * f(xx @ w)).sum(), xx, create_graph=True)
    return torch.autograd.grad((g * g).sum(), w)[0]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_gradient_penalty_through_elastic_softmax_is_exact():
    torch.manual_seed(0)
    x, w, c = torch.randn(6, 9, dtype=F64), torch.randn(9, 9, dtype=F64), torch.randn(6, 9, dtype=F64)
    got = penalty_grad(lambda s: elastic_softmax(s, 0.7, 0.3), x, w, c)
    want = penalty_grad(lambda s: plain_elastic(s, 0.7, 0.3), x, w, c)
    assert want.abs().max() > 0.1
    assert rel(got, want) < 1e-9


@pytest.mark.parametrize("per_row", [False, True])
def test_gradgradcheck_elastic_softmax_in_x_tau_beta(per_row: bool):
    torch.manual_seed(1)
    x = torch.randn(3, 7, dtype=F64, requires_grad=True)
    tau = (torch.full((3, 1), 0.7, dtype=F64) if per_row else torch.tensor(0.7, dtype=F64))
    beta = torch.tensor(0.3, dtype=F64, requires_grad=True)
    tau.requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda a, t, b: elastic_softmax(a, t, b), (x, tau, beta))


@pytest.mark.parametrize("fn", [softmax, softmax1])
def test_gradgradcheck_softmax_and_softmax1(fn):
    torch.manual_seed(2)
    x = torch.randn(3, 7, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("causal", [False, True])
def test_gradient_penalty_through_elastic_attention_is_exact(causal: bool):
    torch.manual_seed(3)
    b, h, length, d = 1, 2, 6, 4
    k, v = torch.randn(b, h, length, d, dtype=F64), torch.randn(b, h, length, d, dtype=F64)
    q, w = torch.randn(b, h, length, d, dtype=F64), torch.randn(d, d, dtype=F64)
    c = torch.randn(b, h, length, d, dtype=F64)

    def fused(qq):
        return elastic_attention(qq, k, v, tau=0.9, beta=0.2, causal=causal)

    got = penalty_grad(fused, q, w, c)
    want = penalty_grad(lambda qq: plain_attention(qq, k, v, 0.9, 0.2, causal), q, w, c)
    assert want.abs().max() > 0.01
    assert rel(got, want) < 1e-9


def test_gradgradcheck_elastic_attention_with_per_head_parameters():
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 5, 3, dtype=F64, requires_grad=True) for _ in range(3))
    tau = torch.tensor([0.8, 1.3], dtype=F64, requires_grad=True)
    beta = torch.tensor(0.4, dtype=F64, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda a, b, c, t, be: elastic_attention(a, b, c, tau=t, beta=be), (q, k, v, tau, beta))


def test_first_order_gradients_are_unchanged_by_create_graph():
    """create_graph takes the differentiable path; its first order equals the fused one's."""
    torch.manual_seed(5)
    x = torch.randn(4, 33, dtype=F64, requires_grad=True)
    g = torch.randn(4, 33, dtype=F64)
    (plain,) = torch.autograd.grad(elastic_softmax(x, 0.5, 1.0), x, g)
    (graph,) = torch.autograd.grad(elastic_softmax(x, 0.5, 1.0), x, g, create_graph=True)
    torch.testing.assert_close(graph.detach(), plain, rtol=1e-13, atol=1e-15)
