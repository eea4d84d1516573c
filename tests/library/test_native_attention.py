"""The fused CPU Elastic-attention kernel (kernels/cpp/attention.cpp): forward and all five
gradients against the eager composite in fp64, tiles crossing several blocks, the special
queries, every instruction set and thread count, and elastic_attention choosing it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from elasticbench import native
from elasticbench.attention import autograd, native_attention
from elasticbench.attention.composite import elastic_attention_composite
from elasticbench.functional import elastic_attention
from elasticbench.harness.kinds.attention.kernel_contract import (
    backward_step,
    forward_output,
    kernel_arguments,
)
from elasticbench.harness.registry import get_kernel

pytestmark = pytest.mark.needs("native")
F64 = torch.float64


@pytest.fixture
def ext():
    module = native.load()
    yield module
    module.set_isa(module.isas()[0])


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 3 queries x 2 keys: the online max and sum cross several blocks."""
    monkeypatch.setattr(native_attention, "BLOCK_Q", 3)
    monkeypatch.setattr(native_attention, "BLOCK_K", 2)


def _qkv(lq, lk, d=8, b=2, h=3, dtype=F64, seed=0, grad=True, dv=None):
    g = torch.Generator().manual_seed(seed)
    shapes = ((b, h, lq, d), (b, h, lk, d), (b, h, lk, dv or d))
    return [(torch.randn(s, generator=g, dtype=F64) * 1.5).to(dtype).requires_grad_(grad)
            for s in shapes]


def _grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return torch.autograd.grad(out, inputs, g.to(out.dtype))


def test_elastic_attention_runs_the_native_kernel_on_cpu_tensors():
    assert autograd.choose(torch.zeros(1, 1, 1, 1)).name == "cpp"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("lq", "lk", "dv"), [(7, 7, 8), (5, 11, 3), (11, 5, 8)])
def test_forward_and_five_gradients_match_the_composite(small_tiles, causal, lq, lk, dv):
    q, k, v = _qkv(lq, lk, dv=dv)
    tau = torch.tensor([0.5, 1.0, 3.0], dtype=F64, requires_grad=True)
    beta = torch.tensor([0.3, 2.0, 0.0], dtype=F64, requires_grad=True)
    kw = {"tau": tau, "beta": beta, "causal": causal}
    o1, o2 = elastic_attention(q, k, v, **kw), elastic_attention_composite(q, k, v, **kw)
    torch.testing.assert_close(o1, o2, rtol=1e-13, atol=1e-14)
    inputs = (q, k, v, tau, beta)
    for a, b in zip(_grads(o1, inputs), _grads(o2, inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_gradcheck_across_tiles(small_tiles):
    q, k, v = _qkv(4, 5, d=3, b=1, h=2)
    tau = torch.tensor([0.7, 1.3], dtype=F64, requires_grad=True)
    beta = torch.tensor(0.4, dtype=F64, requires_grad=True)
    for causal in (False, True):
        fn = lambda q, k, v, t, b: elastic_attention(q, k, v, tau=t, beta=b, causal=causal)  # noqa: B023, E731
        assert torch.autograd.gradcheck(fn, (q, k, v, tau, beta))


def test_fp32_matches_the_fp64_composite_with_large_tiles():
    """The default tiles and the BLAS GEMMs: 300 queries and 600 keys cross two blocks each.
    Scores up to about 20/tau carry fp32 rounding of order 20 eps / tau into every weight."""
    assert native_attention.BLOCK_Q < 300 < 2 * native_attention.BLOCK_Q
    assert native_attention.BLOCK_K < 600 < 2 * native_attention.BLOCK_K
    q, k, v = _qkv(300, 600, d=16, b=1, h=2, dtype=torch.float32)
    kw = {"tau": 0.5, "beta": 1.0, "causal": True}
    out = elastic_attention(q, k, v, **kw)
    want = elastic_attention_composite(*(t.detach().double() for t in (q, k, v)), **kw)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=2e-5)
    got = _grads(out, (q, k, v))
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    for a, b in zip(got, _grads(elastic_attention_composite(*ref, **kw), ref), strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_a_query_that_keeps_no_key_gives_exactly_zero_and_zero_gradients(small_tiles, beta):
    q, k, v = _qkv(4, 5, b=1, h=2)
    with torch.no_grad():
        q.copy_(-q.abs() - 0.1)
        k.copy_(k.abs() + 0.1)  # every score negative
        q[0, 1, 2] = q[0, 1, 2].abs()  # except query 2 of head 1, which keeps every key
    tau = torch.tensor(1.0, dtype=F64, requires_grad=True)
    b = torch.tensor(beta, dtype=F64, requires_grad=True)
    out = elastic_attention(q, k, v, tau=tau, beta=b)
    dead = torch.ones(out.shape[:3], dtype=torch.bool)
    dead[0, 1, 2] = False
    assert torch.equal(out[dead], torch.zeros_like(out[dead]))
    assert (out[0, 1, 2] != 0).all()
    dq, dk, dv = _grads(out, (q, k, v))
    assert torch.equal(dq[dead], torch.zeros_like(dq[dead]))
    assert torch.equal(dk[0, 0], torch.zeros_like(dk[0, 0]))
    assert torch.equal(dv[0, 0], torch.zeros_like(dv[0, 0]))


def test_nan_queries_and_keys_give_nan_exactly_where_seen(small_tiles):
    q, k, v = _qkv(5, 5, b=1, h=1, grad=False)
    q[0, 0, 1, 3] = math.nan
    out = elastic_attention(q, k, v, tau=1.0, beta=1.0)
    assert out[0, 0, 1].isnan().all() and not out[0, 0, [0, 2, 3, 4]].isnan().any()
    q, k, v = _qkv(5, 5, b=1, h=1, grad=False)
    k[0, 0, 3, 0] = math.nan  # seen by queries 3 and 4 only, causally
    out = elastic_attention(q, k, v, tau=1.0, beta=1.0, causal=True)
    assert out[0, 0, 3:].isnan().all() and not out[0, 0, :3].isnan().any()


def test_nan_query_gradients_are_nan(small_tiles):
    q, k, v = _qkv(4, 6, b=1, h=1)
    with torch.no_grad():
        q[0, 0, 2, 0] = math.nan
    tau = torch.tensor(1.0, dtype=F64, requires_grad=True)
    beta = torch.tensor(1.0, dtype=F64, requires_grad=True)
    dq, dtau, dbeta = _grads(elastic_attention(q, k, v, tau=tau, beta=beta), (q, tau, beta))
    assert dq[0, 0, 2].isnan().all() and not dq[0, 0, [0, 1, 3]].isnan().any()
    assert dtau.isnan() and dbeta.isnan()


def test_an_infinite_score_gives_the_mean_of_its_values_and_its_share_of_dv(small_tiles):
    q, k, v = _qkv(3, 6, b=1, h=1, d=2)
    with torch.no_grad():
        q[0, 0, 1] = torch.tensor([math.inf, 0.0])
        k[0, 0, :, 0] = torch.tensor([1.0, -1.0, 2.0, -3.0, 0.5, -0.5])  # +inf at keys 0, 2, 4
        k[0, 0, :, 1] = 1.0
    out = elastic_attention(q, k, v, tau=0.5, beta=1.0)
    torch.testing.assert_close(out[0, 0, 1], v[0, 0, [0, 2, 4]].mean(0), rtol=1e-15, atol=0)
    want = elastic_attention_composite(q, k, v, tau=0.5, beta=1.0)
    for a, b in zip(_grads(out, (q, v)), _grads(want, (q, v)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_compute_in_fp32_and_round_once(dtype):
    q, k, v = _qkv(9, 12, dtype=dtype, grad=False)
    out = elastic_attention(q, k, v, tau=0.5, beta=1.0, causal=True)
    want = elastic_attention_composite(q.double(), k.double(), v.double(), tau=0.5, beta=1.0,
                                       causal=True)
    assert out.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.double(), want, rtol=eps, atol=eps)


def _run(ext, q, k, v, causal, blocks=(4, 3)):
    b, h = q.shape[:2]
    tau = torch.linspace(0.5, 2.0, b * h, dtype=q.dtype).reshape(b, h)
    beta = torch.linspace(0.0, 1.5, b * h, dtype=q.dtype).reshape(b, h)
    out, m, den = ext.attention_forward(q, k, v, tau, beta, 0.3, causal, *blocks)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=q.dtype)
    grads = ext.attention_backward(q, k, v, out, do, m, den, tau, beta, 0.3, causal, *blocks)
    return (out, m, den, *grads)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_every_instruction_set_agrees(ext, dtype):
    """The widest set against every other: the same exponential, sums in other orders."""
    q, k, v = _qkv(21, 19, d=5, grad=False, dtype=dtype)  # rows that end in vector tails
    tol = {F64: 1e-13, torch.float32: 2e-6}[dtype]
    for causal in (False, True):
        ext.set_isa(ext.isas()[0])
        want = _run(ext, q, k, v, causal)
        for isa in ext.isas()[1:]:
            ext.set_isa(isa)
            for a, b in zip(_run(ext, q, k, v, causal), want, strict=True):
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("heads", [1, 6])
def test_results_do_not_depend_on_the_thread_count(ext, heads):
    """One thread owns a query block (forward); the backward's two schedules (a head per
    thread with 1 thread; key blocks, then query blocks, with 1 head on 3 threads) add in
    the same order: bit-for-bit equal."""
    q, k, v = _qkv(23, 17, d=4, b=1, h=heads, grad=False, dtype=torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run(ext, q, k, v, True)
        torch.set_num_threads(3)
        many = _run(ext, q, k, v, True)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, many, strict=True):
        assert torch.equal(a, b)


def test_block_sizes_do_not_change_the_function(ext):
    q, k, v = _qkv(13, 10, d=3, b=1, h=2, grad=False)
    for causal in (False, True):
        want = _run(ext, q, k, v, causal, blocks=(256, 256))
        for blocks in ((1, 1), (5, 3), (13, 10)):
            for a, b in zip(_run(ext, q, k, v, causal, blocks), want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)


def test_the_aten_gemm_path_matches_the_blas_one(ext):
    """Where torch exports no Fortran BLAS the tiles go through at::addmm: the same function."""
    q, k, v = _qkv(9, 7, d=3, b=1, h=2, grad=False)
    want = _run(ext, q, k, v, True)
    ext.attention_use_blas(False)
    try:
        got = _run(ext, q, k, v, True)
    finally:
        ext.attention_use_blas(True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("causal", [0.0, 1.0])
def test_the_registered_kernel_follows_the_attention_contract(causal):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, n, 4)) for n in (5, 6, 6))
    dout = torch.from_numpy(rng.standard_normal((1, 2, 5, 4)))
    params = {"tau": 0.7, "beta": 0.4, "causal": causal}
    results = []
    for name in ("cpp_attention", "torch_attention_composite"):
        fwd, bwd = get_kernel(name), get_kernel(name, "bwd")
        assert fwd.backend == name.partition("_")[0]
        args, kw = kernel_arguments(fwd, q, k, v, params, "fp64", 0.5)
        out = forward_output(fwd.fn(*args, **kw))
        args, kw = kernel_arguments(bwd, q, k, v, params, "fp64", 0.5)
        results.append((out, *backward_step(bwd.fn(*args, **kw))(dout)))
    assert results[0][4].shape == (1, 2)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_empty_lengths_give_empty_or_zero_outputs():
    q, k, v = _qkv(3, 0, d=4, b=1, h=2, dv=5)
    out = elastic_attention(q, k, v, tau=1.0, beta=1.0)
    assert out.shape == (1, 2, 3, 5) and torch.equal(out, torch.zeros_like(out))
    assert torch.equal(_grads(out, (q,))[0], torch.zeros_like(q))
    q, k, v = _qkv(0, 3, d=4, b=1, h=2)
    assert elastic_attention(q, k, v, tau=1.0, beta=1.0).shape == (1, 2, 0, 4)
