"""elasticbench.rows.tiers: the tier chosen for a forward is chosen again for its backward
(the custom ops of rows.ops choose from the same inputs); tiers register themselves and
decline what they cannot take."""

from __future__ import annotations

import math

import pytest
import torch

from elasticbench import functional as F
from elasticbench import native
from elasticbench.rows import tiers
from elasticbench.rows.tiers import SOFTMAX, SOFTMAX1, ExpSpec, Tier


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


class _Counting:
    """A tier that runs the torch code and counts its calls and the specs it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ExpSpec]] = []
        self.tier = Tier("counting", lambda x, spec: True, self.forward, self.backward)

    def forward(self, x, spec):
        self.calls.append(("fwd", spec))
        return tiers.TORCH.forward(x, spec)

    def backward(self, x, y, g, spec, params):
        self.calls.append(("bwd", spec))
        return tiers.TORCH.backward(x, y, g, spec, params)


@pytest.fixture
def counting(monkeypatch):
    c = _Counting()
    tiers.tiers()  # the tier modules imported first, so that the fake comes before them
    monkeypatch.setattr(tiers, "_registered", {"counting": c.tier, **tiers._registered})
    return c


def test_the_backward_runs_on_the_tier_the_forward_chose(counting):
    x = _x(3, 11).requires_grad_()
    tau = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    y = F.elastic_softmax(x, tau, 0.4)
    y.backward(_x(3, 11))
    assert [kind for kind, _ in counting.calls] == ["fwd", "bwd"]
    fwd, bwd = (spec for _, spec in counting.calls)
    for spec in (fwd, bwd):
        assert spec.mask_negative and float(spec.offset) == pytest.approx(0.4)
        assert torch.equal(spec.tau, torch.tensor(0.7, dtype=torch.float64))
    spec = ExpSpec(True, tau=tau.detach(), offset=torch.tensor(0.4, dtype=torch.float64))
    ref = tiers.TORCH.forward(x.detach(), spec)  # the torch code itself: the same numbers
    ref_dx, ref_dtau, _ = tiers.TORCH.backward(x.detach(), ref, _x(3, 11), spec, True)
    assert torch.equal(y.detach(), ref)
    assert torch.equal(x.grad, ref_dx) and torch.equal(tau.grad, ref_dtau.sum())


@pytest.mark.parametrize(("fn", "spec"), [(F.softmax, SOFTMAX), (F.softmax1, SOFTMAX1)])
def test_softmax_and_softmax1_pass_their_spec(counting, fn, spec):
    x = _x(2, 5, 6).requires_grad_()
    fn(x, dim=1).sum().backward()
    for _, got in counting.calls:
        assert (got.mask_negative, got.floor, float(got.tau)) == \
            (spec.mask_negative, spec.floor, spec.tau)
        assert (got.offset is None) == (spec.offset is None)
        assert spec.offset is None or float(got.offset) == spec.offset
    assert [kind for kind, _ in counting.calls] == ["fwd", "bwd"]


def test_per_row_and_scalar_parameters_take_the_native_tier():
    x = _x(4, 6, 9)
    native_tier = "cpp" if native.unavailable() is None else "torch"
    per_row = ExpSpec(True, tau=torch.full((4, 6, 1), 0.5), offset=1.0)
    assert not per_row.scalar() and tiers.choose(x, per_row).name == native_tier
    scalar = ExpSpec(True, tau=torch.tensor(0.5), offset=1.0)
    assert scalar.scalar()
    assert tiers.choose(x, scalar).name == native_tier
    assert tiers.choose(x.float(), scalar).name == tiers.choose(x, scalar).name
    assert tiers.choose(x.int(), scalar) is tiers.TORCH  # not a dtype the native kernels take
    names = [t.name for t in tiers.tiers()]
    assert names[-1] == "torch" and names.count("torch") == 1


def test_the_triton_tier_declines_cpu_tensors_and_softmax():
    pytest.importorskip("elasticbench.kernels.triton.tier")
    from elasticbench.kernels.triton import tier

    x = _x(2, 8)
    assert not tier.accepts(x, ExpSpec(True, tau=1.0, offset=1.0))
    assert not tier.accepts(x, SOFTMAX)
    assert tier.TRITON in tiers.tiers()


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
    from elasticbench.rows import cpp

    wd = torch.float64 if dtype == torch.float64 else torch.float32
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 3, 5, 40, generator=g) * 3).to(dtype)
    tau = (torch.rand(1, 3, 1, 1, generator=g) + 0.3).to(wd)
    beta = torch.rand(2, 1, 1, 1, generator=g).to(wd)
    spec = ExpSpec(True, tau=tau, offset=beta)
    y = cpp.forward(x, spec)
    for b in range(2):
        for h in range(3):
            one = ExpSpec(True, tau=float(tau[0, h, 0, 0]), offset=float(beta[b, 0, 0, 0]))
            assert torch.equal(cpp.forward(x[b, h], one), y[b, h])
    up = torch.randn(x.shape, generator=g).to(dtype)
    got = cpp.backward(x, y, up, spec, True)
    want = tiers.TORCH.backward(x, y, up, spec, True)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-2)
    for a, b_ in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b_.double(), rtol=tol, atol=tol)
