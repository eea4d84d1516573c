"""The fixed cost of one eager attention call (docs/attention.md section 7): what the call
runs beside the kernels. Each test counts the aten ops a call runs (torch's profiler),
never its time, and checks that the results do not depend on the shortcut."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from elasticbench.attention import special
from elasticbench.attention.autograd import bh_params
from elasticbench.functional import elastic_attention

pytestmark = pytest.mark.needs("native")


def _ops(fn) -> collections.Counter:
    """How many times fn runs each aten op (torch's profiler, CPU)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return collections.Counter(e.name for e in prof.events())


def _qkv(b: int = 2, h: int = 3, length: int = 8, d: int = 4) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, length, d, generator=gen).requires_grad_() for _ in range(3)]


def test_the_backward_zeroes_only_the_gradients_it_accumulates() -> None:
    """dq, dk and dv are zeroed (the kernel accumulates into them); m and den take no
    gradient, so autograd does not fill one with zeros on every backward."""
    q, k, v = _qkv()
    out = elastic_attention(q, k, v, tau=0.5, beta=1.0, is_causal=True)
    ops = _ops(lambda: out.backward(torch.ones_like(out)))
    assert ops["aten::zeros"] == 3
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_a_gradient_that_does_not_reach_out_gives_zeros() -> None:
    """With no gradient for out (autograd passes None), every input's gradient is zero,
    as with materialized gradients (gradcheck's undefined-gradient check)."""
    q, k, v = (t.detach().double().requires_grad_() for t in _qkv(1, 2, 5, 3))
    tau = torch.tensor([0.7, 1.3], dtype=torch.float64, requires_grad=True)
    fn = lambda q, k, v, t: elastic_attention(q, k, v, tau=t, beta=0.4, causal=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, tau), check_undefined_grad=True)


def test_a_float_parameters_view_is_made_once() -> None:
    """A float tau (beta, ...) is the same cached (batch, heads) view on each call of a
    shape: no fill or expand per call; another shape gets its own."""
    q = torch.zeros(2, 3, 4, 8)
    first = bh_params(0.625, q)
    assert bh_params(0.625, q) is first and first.shape == (2, 3)
    assert _ops(lambda: bh_params(0.625, q)) == collections.Counter()
    other = bh_params(0.625, torch.zeros(5, 3, 4, 8))
    assert other.shape == (5, 3) and torch.equal(other, torch.full((5, 3), 0.625))


@pytest.mark.parametrize("shape", [(), (1,), (3,)])
def test_a_per_head_parameter_is_one_view_and_sums_its_gradient(shape) -> None:
    """0-d, (1,) and per-head parameters become (batch, heads) by one expand, and their
    gradient is the per-(batch, head) one summed over what was broadcast."""
    q = torch.zeros(2, 3, 4, 8)
    tau = (torch.rand(shape) + 0.5).requires_grad_()
    view = bh_params(tau, q)
    assert view.shape == (2, 3) and view.data_ptr() == tau.data_ptr()
    grad = torch.arange(6.0).reshape(2, 3)
    view.backward(grad)
    assert torch.equal(tau.grad, grad.sum_to_size((1, tau.numel())).reshape(shape))


def test_finite_statistics_run_no_search_for_infinite_queries() -> None:
    """special's fix runs one reduction when no query is marked, and still finishes a
    marked one (m = +inf) after it."""
    q, k, v = (t.detach() for t in _qkv(1, 1, 3, 2))
    out, m = torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3)
    den = torch.ones(1, 1, 3)
    ops = _ops(lambda: special.fix_forward(q, k, v, out, m, den, 1.0, False))
    assert ops["aten::nonzero"] == 0 and ops["aten::max"] == 1
    k[0, 0, 1] = math.inf * q[0, 0, 0].sign()  # query 0's score with key 1 is +inf
    m[0, 0, 0] = math.inf
    special.fix_forward(q, k, v, out, m, den, 1.0, False)
    assert torch.equal(out[0, 0, 0], v[0, 0, 1]) and den[0, 0, 0] == 1
    assert torch.equal(out[0, 0, 1:], torch.zeros(2, 2))
