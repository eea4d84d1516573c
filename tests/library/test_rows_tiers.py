"""elasticbench.rows.tiers and elasticbench.dispatch: one implementation per call, chosen by
the device's preference or forced by $ELASTICBENCH_IMPLEMENTATION, runs both the forward
and the backward (the eager autograd function and the custom ops alike); implementations
decline what they cannot take."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import pytest
import torch

from elasticbench import dispatch, native, settings
from elasticbench import functional as F
from elasticbench.rows import exp_normalize, tiers
from elasticbench.rows.spec import SOFTMAX, SOFTMAX1, ExpSpec


@pytest.fixture(autouse=True)
def _forget_the_implementation_read() -> Iterator[None]:
    yield  # the settings keep $ELASTICBENCH_IMPLEMENTATION once read; tests here change it
    settings.refresh()


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


@pytest.fixture
def counting(monkeypatch):
    """The torch implementation forced, its two computations counted."""
    calls: list[str] = []
    fwd, bwd = exp_normalize.exp_normalize_forward, exp_normalize.exp_normalize_backward

    def forward(*args, **kwargs):
        calls.append("fwd")
        return fwd(*args, **kwargs)

    def backward(*args, **kwargs):
        calls.append("bwd")
        return bwd(*args, **kwargs)

    monkeypatch.setattr(tiers, "exp_normalize_forward", forward)
    monkeypatch.setattr(tiers, "exp_normalize_backward", backward)
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, "torch")
    settings.refresh()  # the variable is read once: read it again
    return calls


@pytest.mark.parametrize("traced", [False, True])
def test_the_backward_runs_on_the_implementation_the_forward_chose(counting, monkeypatch,
                                                                   traced):
    """Forced to torch, both directions run the torch code, through the autograd function
    or (traced) the custom ops, with the same numbers as the torch code called directly."""
    if traced:
        monkeypatch.setattr("elasticbench.rows.ops.traced", lambda x: True)
    x = _x(3, 11).requires_grad_()
    tau = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    y = F.elastic_softmax(x, tau, 0.4)
    g = _x(3, 11)
    y.backward(g)
    assert counting == ["fwd", "bwd"]
    spec = ExpSpec(True, tau=tau.detach(), offset=torch.tensor(0.4, dtype=torch.float64))
    ref = tiers.TORCH.forward(x.detach(), spec)
    ref_dx, ref_dtau, _ = tiers.TORCH.backward(x.detach(), ref, g, spec, True)
    assert torch.equal(y.detach(), ref)
    assert torch.equal(x.grad, ref_dx) and torch.equal(tau.grad, ref_dtau.sum())


@pytest.mark.parametrize("fn", [F.softmax, F.softmax1])
def test_softmax_and_softmax1_run_forward_and_backward(counting, fn):
    x = _x(2, 5, 6).requires_grad_()
    fn(x, dim=1).sum().backward()
    assert counting == ["fwd", "bwd"]


def test_a_call_without_gradients_runs_the_forward_alone(counting):
    with torch.no_grad():
        F.elastic_softmax(_x(2, 5).requires_grad_(), 0.5, 0.5)
    F.elastic_softmax(_x(2, 5), 0.5, 0.5)  # nothing requires grad
    assert counting == ["fwd", "fwd"]


def test_per_row_and_scalar_parameters_take_the_native_implementation():
    x = _x(4, 6, 9)
    native_name = "cpp" if native.unavailable() is None else "torch"
    per_row = ExpSpec(True, tau=torch.full((4, 6, 1), 0.5), offset=1.0)
    assert not per_row.scalar() and tiers.choose(x, per_row).name == native_name
    scalar = ExpSpec(True, tau=torch.tensor(0.5), offset=1.0)
    assert scalar.scalar()
    assert tiers.choose(x, scalar).name == native_name
    assert tiers.choose(x.float(), scalar).name == tiers.choose(x, scalar).name
    assert tiers.choose(x.int(), scalar) is tiers.TORCH  # not a dtype the native kernels take


def test_the_preference_by_device_and_the_switch(monkeypatch):
    monkeypatch.delenv(dispatch.IMPLEMENTATION_ENV, raising=False)
    settings.refresh()  # the variable is read once: read it again
    assert dispatch.preference(torch.device("cpu")) == ("cpp", "torch")
    assert dispatch.preference(torch.device("cuda")) == ("triton", "torch")
    assert dispatch.preference(torch.device("meta")) == ("torch",)
    for name in ("cpp", "triton"):
        monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, name)
        settings.refresh()  # the variable is read once: read it again
        assert dispatch.preference(torch.device("cpu")) == (name, "torch")
        assert dispatch.preference(torch.device("cuda")) == (name, "torch")
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, "torch")
    settings.refresh()  # the variable is read once: read it again
    assert dispatch.preference(torch.device("cuda")) == ("torch",)
    assert tiers.choose(_x(2, 3), ExpSpec(True, tau=0.5, offset=0.5)) is tiers.TORCH
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, "auto")
    settings.refresh()  # the variable is read once: read it again
    assert dispatch.preference(torch.device("cpu")) == ("cpp", "torch")
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, "fast")
    with pytest.raises(ValueError, match="ELASTICBENCH_IMPLEMENTATION must be one of"):
        settings.refresh()
    with pytest.raises(ValueError, match="ELASTICBENCH_IMPLEMENTATION must be one of"):
        F.elastic_softmax(_x(2, 3), 0.5, 0.5)  # a failed read keeps nothing: each call says so


def test_the_variable_is_read_once_until_refreshed(monkeypatch):
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, "torch")
    settings.refresh()
    assert dispatch.preference(torch.device("cpu")) == ("torch",)
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, "cpp")  # not read: a call reads nothing
    assert dispatch.preference(torch.device("cpu")) == ("torch",)
    settings.refresh()
    assert dispatch.preference(torch.device("cpu")) == ("cpp", "torch")
    with dispatch.forcing("triton"):
        assert dispatch.preference(torch.device("cpu")) == ("triton", "torch")
        with dispatch.forcing(None):
            assert dispatch.preference(torch.device("cpu")) == ("cpp", "torch")
    assert dispatch.preference(torch.device("cpu")) == ("cpp", "torch")
    assert os.environ[dispatch.IMPLEMENTATION_ENV] == "cpp"  # a block sets no variable
    with pytest.raises(ValueError, match="must be one of"), dispatch.forcing("fast"):
        pass
    assert dispatch.forced() == "cpp"


def test_the_triton_implementation_declines_what_its_kernels_do_not_take(monkeypatch):
    pytest.importorskip("elasticbench.kernels.triton.tier")
    from elasticbench.kernels.triton import tier

    # (the interpreter's flag, not its variable: the kernels' modules must not be imported
    # under the interpreter in a process that compiles them)
    monkeypatch.setattr(tier, "triton_interpreted", lambda: False)
    x = _x(2, 8).float()
    assert not tier.accepts(x, ExpSpec(True, tau=1.0, offset=1.0))  # CPU, no interpreter
    monkeypatch.setattr(tier, "triton_interpreted", lambda: True)
    assert tier.accepts(x, ExpSpec(True, tau=1.0, offset=1.0))
    assert not tier.accepts(x, SOFTMAX) and not tier.accepts(x, SOFTMAX1)
    assert not tier.accepts(x.double(), ExpSpec(True, tau=1.0, offset=1.0))  # fp64: torch
    monkeypatch.setenv(dispatch.IMPLEMENTATION_ENV, "triton")
    settings.refresh()  # the variable is read once: read it again
    assert tiers.choose(x.double(), ExpSpec(True, tau=1.0, offset=1.0)) is tiers.TORCH


def test_the_keep_mask_of_each_spec():
    x = torch.tensor([-1.0, -0.0, 0.0, 2.0, -math.inf, math.inf, math.nan])
    assert ExpSpec(True).keep(x).tolist() == [False, True, True, True, False, True, False]
    assert SOFTMAX.keep(x).tolist() == [True, True, True, True, False, True, False]


@pytest.mark.needs("native")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_native_per_row_parameters_are_the_scalar_kernel_row_by_row(dtype):
    """Per-head tau and per-batch beta reach the native kernels: each row's output is
    bitwise the scalar kernel's with that row's pair, and the gradients match the torch
    code's (docs/native.md)."""
    from elasticbench.rows import native_rows

    wd = torch.float64 if dtype == torch.float64 else torch.float32
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 3, 5, 40, generator=g) * 3).to(dtype)
    tau = (torch.rand(1, 3, 1, 1, generator=g) + 0.3).to(wd)
    beta = torch.rand(2, 1, 1, 1, generator=g).to(wd)
    spec = ExpSpec(True, tau=tau, offset=beta)
    y = native_rows.forward(x, spec)
    for b in range(2):
        for h in range(3):
            one = ExpSpec(True, tau=float(tau[0, h, 0, 0]), offset=float(beta[b, 0, 0, 0]))
            assert torch.equal(native_rows.forward(x[b, h], one), y[b, h])
    up = torch.randn(x.shape, generator=g).to(dtype)
    got = native_rows.backward(x, y, up, spec, True)
    want = tiers.TORCH.backward(x, y, up, spec, True)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-2)
    for a, b_ in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b_.double(), rtol=tol, atol=tol)
