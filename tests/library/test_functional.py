"""elasticbench.functional: hand-written backward against gradcheck, autograd and the policy."""

from __future__ import annotations

import math

import pytest
import torch

from elasticbench import functional as F
from elasticbench.rows.spec import ExpSpec
from elasticbench.rows.tiers import choose


def _composite(x, tau, beta, dim=-1):
    """Elastic-Softmax as plain torch ops, for autograd to differentiate (finite rows only)."""
    e = torch.where(x >= 0, torch.exp(torch.where(x >= 0, x, 0) / tau), 0)
    return e / (e.sum(dim=dim, keepdim=True) + beta)


def _x(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_gradcheck_scalar_tau_beta_fp64():
    x = _x(3, 9).requires_grad_()
    tau = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(F.elastic_softmax, (x, tau, beta))


def test_gradcheck_per_head_params_and_other_dim():
    x = _x(2, 3, 4, 3).requires_grad_()  # softmax over dim 2
    tau = (torch.rand(3, 1, 1, dtype=torch.float64) + 0.5).requires_grad_()
    beta = torch.rand(3, 1, 1, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, t, b: F.elastic_softmax(a, t, b, dim=2),
                                    (x, tau, beta))


@pytest.mark.parametrize("fn", [F.softmax, F.softmax1])
def test_gradcheck_softmax_family(fn):
    x = _x(4, 7, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: fn(a, dim=0), (x,))


def test_matches_autograd_through_the_composite():
    x = (_x(5, 33, seed=1) * 3).requires_grad_()
    tau = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    g = _x(5, 33, seed=2)
    grads = torch.autograd.grad(F.elastic_softmax(x, tau, beta), (x, tau, beta), g)
    x2 = x.detach().clone().requires_grad_()
    t2, b2 = tau.detach().clone().requires_grad_(), beta.detach().clone().requires_grad_()
    ref = torch.autograd.grad(_composite(x2, t2, b2), (x2, t2, b2), g)
    for a, b in zip(grads, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_softmax_and_softmax1_forward_values():
    x = _x(3, 6, seed=4)
    torch.testing.assert_close(F.softmax(x), torch.softmax(x, -1))
    e = torch.exp(x)
    torch.testing.assert_close(F.softmax1(x), e / (1 + e.sum(-1, keepdim=True)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_dtypes_keep_dtype_and_agree_with_fp64(dtype):
    x = _x(4, 64, seed=5, dtype=dtype).requires_grad_()
    tau = torch.tensor(0.5, requires_grad=True)
    beta = torch.tensor(1.0, requires_grad=True)
    y = F.elastic_softmax(x, tau, beta)
    assert y.dtype == dtype
    g = _x(4, 64, seed=6, dtype=dtype)
    dx, dtau, dbeta = torch.autograd.grad(y, (x, tau, beta), g)
    assert dx.dtype == dtype and dtau.dtype == torch.float32 and dbeta.dtype == torch.float32
    x64 = x.detach().double().requires_grad_()
    t64 = tau.detach().double().requires_grad_()
    b64 = beta.detach().double().requires_grad_()
    ref = torch.autograd.grad(_composite(x64, t64, b64), (x64, t64, b64), g.double())
    tol = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(dx.double(), ref[0], rtol=tol, atol=tol * ref[0].abs().max())
    assert abs(dtau.item() - ref[1].item()) <= tol * (abs(ref[1].item()) + 1e-3)
    assert abs(dbeta.item() - ref[2].item()) <= tol * (abs(ref[2].item()) + 1e-3)


def _grads(x, tau=1.0, beta=1.0):
    x = x.clone().requires_grad_()
    t = torch.tensor(tau, dtype=x.dtype, requires_grad=True)
    b = torch.tensor(beta, dtype=x.dtype, requires_grad=True)
    y = F.elastic_softmax(x, t, b)
    g = torch.linspace(-1, 2, x.shape[-1], dtype=x.dtype).expand_as(x)
    return (y, *torch.autograd.grad(y, (x, t, b), g))


def test_masked_positions_get_exactly_zero_gradient():
    x = torch.tensor([[1.0, -2.0, 0.0, -0.0, -math.inf, 3.0]])
    y, dx, _, _ = _grads(x)
    assert (dx[0, [1, 4]] == 0).all() and (y[0, [1, 4]] == 0).all()
    assert (dx[0, [0, 2, 3, 5]] != 0).all()  # both zeros are kept (one-sided derivative)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_fully_masked_rows_give_zero_gradients_never_nan(beta):
    x = torch.tensor([[-1.0, -2.0, -math.inf], [-3.0, -0.5, -1.0]])
    y, dx, dtau, dbeta = _grads(x, beta=beta)
    assert (y == 0).all() and (dx == 0).all()
    assert dtau.item() == 0 and dbeta.item() == 0


def test_nan_propagates_to_every_gradient():
    x = torch.tensor([[1.0, math.nan, 2.0], [1.0, 2.0, 3.0]])
    y, dx, dtau, dbeta = _grads(x)
    assert y[0].isnan().all() and dx[0].isnan().all() and not dx[1].isnan().any()
    assert math.isnan(dtau.item()) and math.isnan(dbeta.item())


def test_infinite_rows_are_constant():
    x = torch.tensor([[math.inf, 1.0, math.inf, -1.0]])
    y, dx, dtau, dbeta = _grads(x)
    assert y.tolist() == [[0.5, 0.0, 0.5, 0.0]]
    assert (dx == 0).all() and dtau.item() == 0 and dbeta.item() == 0


def test_huge_logits_keep_gradients_finite():
    x = torch.tensor([[3e38, 1e38, 2.0, -1.0]], dtype=torch.float32)
    y, dx, dtau, dbeta = _grads(x, tau=0.01, beta=100.0)
    assert y[0, 0] == 1 and dx.isfinite().all()
    assert math.isfinite(dtau.item()) and dbeta.item() == 0  # exp(-m/tau) underflows


def test_python_float_parameters_are_checked():
    with pytest.raises(ValueError, match="tau must be finite and > 0"):
        F.elastic_softmax(torch.ones(2, 3), tau=0.0, beta=1.0)
    with pytest.raises(ValueError, match="beta must be finite and >= 0"):
        F.elastic_softmax(torch.ones(2, 3), tau=1.0, beta=-1.0)


def test_the_library_s_domains_are_the_exact_definitions_ranges():
    """elasticbench.domains (the library's checks) and the harness's exact definitions
    (elasticbench.harness.functions) state each parameter's range alike: a value one accepts, the
    other accepts, with the same message when refused."""
    from elasticbench.domains import DOMAINS
    from elasticbench.harness.functions import elastic, sigmoid, symax

    params = {p.name: p for f in (elastic, symax, sigmoid) for p in f.FUNCTION.params}
    assert set(params) == set(DOMAINS)
    for name, domain in DOMAINS.items():
        assert (params[name].lower, params[name].strict) == (domain.lower, domain.strict), name
        for value in (-1.0, -0.0, 0.0, 1e-300, 2.5, math.inf, math.nan, "x"):
            try:
                want = params[name].validate(value)
            except ValueError:
                with pytest.raises(ValueError, match=f"^{name} must be "):
                    domain.check(value)
            else:
                assert domain.check(value) == want, (name, value)
    assert DOMAINS["bias"].describe() == "finite" and DOMAINS["tau"].describe() == "finite and > 0"


def test_parameter_with_a_size_along_dim_is_rejected():
    with pytest.raises(ValueError, match="size 1 along dim"):
        F.elastic_softmax(torch.ones(2, 3), tau=torch.ones(3), beta=1.0)


def test_float_parameters_have_no_gradient_and_triton_is_not_used_on_cpu():
    x = _x(2, 5).requires_grad_()
    y = F.elastic_softmax(x, 0.5, 0.25)
    (dx,) = torch.autograd.grad(y.sum(), (x,))
    assert dx.shape == x.shape
    spec = ExpSpec(True, tau=0.5, offset=0.25)
    assert choose(x, spec).name in ("cpp", "torch")  # never the Triton tier on CPU
