"""The native fused attention for the family's weights (softmax1, symax, stablemax, sigmoid;
kernels/cpp/attention.cpp through elasticbench.attention.native_attention): forward and every
gradient against a plain torch definition in fp64, tiles crossing several blocks, key padding and
causal masks, fp32 and 16-bit inputs, the special values, every instruction set, and the
registered kernels. Elastic's own tests are tests/library/test_native_attention.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from elasticbench import native
from elasticbench.attention import native_attention
from elasticbench.attention.weights import Weight
from elasticbench.harness.kinds.attention.kernel_contract import (
    backward_step,
    forward_output,
    kernel_arguments,
)
from elasticbench.harness.registry import get_kernel

pytestmark = pytest.mark.needs("native")
F64 = torch.float64
FAMILY = (Weight.SOFTMAX1, Weight.SYMAX, Weight.STABLEMAX, Weight.SIGMOID)


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 3 queries x 2 keys: the running sums cross several blocks."""
    monkeypatch.setattr(native_attention, "BLOCK_Q", 3)
    monkeypatch.setattr(native_attention, "BLOCK_K", 2)


def reference(q, k, v, p_score, p_den, scale, causal, key_mask, weight):
    """The weight's attention written out: scores, weights over the visible keys, w @ v."""
    s = scale * q @ k.transpose(-1, -2)
    lq, lk = s.shape[-2:]
    vis = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        vis = vis & torch.ones(lq, lk, dtype=torch.bool).tril()
    vis = vis.expand(s.shape)
    if key_mask is not None:
        vis = vis & key_mask[:, None, None, :]
    if weight is Weight.SOFTMAX1:
        e = torch.where(vis, torch.exp(s), 0)
        w = e / (1 + e.sum(-1, keepdim=True))
    elif weight is Weight.SYMAX:
        a = torch.where(vis, s.abs(), 0)
        den = p_den[..., None, None] + a.sum(-1, keepdim=True)
        w = a / torch.where(den == 0, 1, den)  # 0/0 (eta = 0, nothing seen) is 0
    elif weight is Weight.STABLEMAX:
        st = torch.where(s >= 0, s + 1, 1 / (1 - torch.clamp(s, max=0)))
        st = torch.where(vis, st, 0)
        den = st.sum(-1, keepdim=True)
        w = st / torch.where(den == 0, 1, den)
    else:
        w = torch.where(vis, torch.sigmoid(s + p_score[..., None, None]), 0)
    return w @ v


def _inputs(lq, lk, d=5, b=2, h=3, dv=4, dtype=F64, seed=0, spread=1.5):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=F64) * spread
    k = torch.randn(b, h, lk, d, generator=g, dtype=F64) * spread
    v = torch.randn(b, h, lk, dv, generator=g, dtype=F64)
    p_score = torch.linspace(-1.0, 0.5, b * h, dtype=F64).reshape(b, h)  # sigmoid's bias
    p_den = torch.linspace(0.0, 2.0, b * h, dtype=F64).reshape(b, h)  # symax's eta, 0 included
    return [t.to(dtype) for t in (q, k, v)] + [p_score.to(dtype), p_den.to(dtype)]


def _fused(q, k, v, p_score, p_den, do, scale, causal, key_mask, weight):
    out, m, den = native_attention.forward(q, k, v, p_score, p_den, scale, causal, key_mask, weight)
    return (out, *native_attention.backward(q, k, v, out, do, m, den, p_score, p_den, scale,
                                            causal, key_mask, weight))


def _reference_grads(q, k, v, p_score, p_den, do, scale, causal, key_mask, weight):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, p_score, p_den)]
    out = reference(*leaves, scale, causal, key_mask, weight)
    grads = torch.autograd.grad(out, leaves, do.double(), allow_unused=True)
    return (out.detach(), *(torch.zeros_like(t) if g is None else g
                            for t, g in zip(leaves, grads, strict=True)))


@pytest.mark.parametrize("weight", FAMILY, ids=lambda w: w.name.lower())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(("lq", "lk"), [(7, 9), (9, 5)])
def test_forward_and_five_gradients_match_the_definition(small_tiles, weight, causal, masked,
                                                         lq, lk):
    q, k, v, p_score, p_den = _inputs(lq, lk)
    key_mask = None
    if masked:  # batch 1 keeps only some keys, batch 0 all but the first
        key_mask = torch.rand(2, lk, generator=torch.Generator().manual_seed(5)) > 0.4
        key_mask[0] = True
        key_mask[0, 0] = False
    do = torch.randn(2, 3, lq, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    got = _fused(q, k, v, p_score, p_den, do, 0.6, causal, key_mask, weight)
    want = _reference_grads(q, k, v, p_score, p_den, do, 0.6, causal, key_mask, weight)
    names = ("out", "dq", "dk", "dv", "dp_score", "dp_den")
    for name, a, b in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13, msg=name)
    # only symax's eta and sigmoid's bias are parameters
    assert got[4].abs().sum() > 0 if weight is Weight.SIGMOID else torch.equal(got[4], 0 * got[4])
    assert got[5].abs().sum() > 0 if weight is Weight.SYMAX else torch.equal(got[5], 0 * got[5])


@pytest.mark.parametrize("weight", FAMILY, ids=lambda w: w.name.lower())
def test_fp32_with_the_default_tiles_matches_the_fp64_definition(weight):
    """300 queries and 600 keys cross two blocks each way, through the BLAS GEMMs."""
    assert native_attention.BLOCK_Q < 300 < 2 * native_attention.BLOCK_Q
    assert native_attention.BLOCK_K < 600 < 2 * native_attention.BLOCK_K
    q, k, v, p_score, p_den = _inputs(300, 600, d=16, b=1, h=2, dv=8, dtype=torch.float32,
                                      spread=1.0)
    do = torch.randn(1, 2, 300, 8, generator=torch.Generator().manual_seed(2))
    got = _fused(q, k, v, p_score, p_den, do, 0.25, True, None, weight)
    want = _reference_grads(q, k, v, p_score, p_den, do, 0.25, True, None, weight)
    assert got[0].dtype == torch.float32
    for a, b in zip(got, want, strict=True):
        scale = float(b.abs().max()) or 1.0
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=2e-5 * scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight", FAMILY, ids=lambda w: w.name.lower())
def test_16_bit_inputs_compute_in_fp32_and_round_once(dtype, weight):
    q, k, v, p_score, p_den = _inputs(9, 12, dtype=dtype)
    out = native_attention.forward(q, k, v, p_score.float(), p_den.float(), 0.5, True, None,
                                   weight)[0]
    want = native_attention.forward(q.float(), k.float(), v.float(), p_score.float(),
                                    p_den.float(), 0.5, True, None, weight)[0]
    assert out.dtype == dtype
    assert torch.equal(out, want.to(dtype))


@pytest.mark.parametrize("weight", FAMILY, ids=lambda w: w.name.lower())
def test_a_query_that_sees_no_key_gives_zeros_and_zero_gradients(small_tiles, weight):
    q, k, v, p_score, p_den = _inputs(4, 5)
    key_mask = torch.ones(2, 5, dtype=torch.bool)
    key_mask[1] = False  # batch 1 has no key at all
    do = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    out, dq, dk, dv, dp_score, dp_den = _fused(q, k, v, p_score, p_den, do, 0.5, False, key_mask,
                                               weight)
    for t in (out[1], dq[1], dk[1], dv[1], dp_score[1], dp_den[1]):
        assert torch.equal(t, torch.zeros_like(t))
    assert (out[0] != 0).all()


@pytest.mark.parametrize("weight", [Weight.SOFTMAX1, Weight.SYMAX, Weight.STABLEMAX],
                         ids=lambda w: w.name.lower())
def test_a_nan_score_makes_its_query_nan_and_nothing_else(small_tiles, weight):
    q, k, v, p_score, p_den = _inputs(5, 6, b=1, h=1)
    q[0, 0, 1, 3] = math.nan
    do = torch.randn(1, 1, 5, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    out, dq, dk, dv, _, dp_den = _fused(q, k, v, p_score, p_den, do, 0.5, False, None, weight)
    assert out[0, 0, 1].isnan().all() and not out[0, 0, [0, 2, 3, 4]].isnan().any()
    assert dq[0, 0, 1].isnan().all() and not dq[0, 0, [0, 2, 3, 4]].isnan().any()
    assert dk.isnan().all() and dv.isnan().all()  # the NaN query sees every key
    assert dp_den.isnan().all() if weight is Weight.SYMAX else torch.equal(dp_den, 0 * dp_den)


def test_sigmoid_nan_weights_stand_alone(small_tiles):
    """A NaN score is NaN for its query's output and its own key's gradients only."""
    q, k, v, p_score, p_den = _inputs(4, 6, b=1, h=1)
    k[0, 0, 2, 0] = math.nan  # key 2: NaN for every query
    do = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    out, _, dk, dv, dp_score, _ = _fused(q, k, v, p_score, p_den, do, 0.5, True, None,
                                         Weight.SIGMOID)
    assert not out[0, 0, :2].isnan().any() and out[0, 0, 2:].isnan().all()  # causal
    assert dk[0, 0, 2].isnan().all() and not dk[0, 0, [0, 1, 3, 4, 5]].isnan().any()
    assert dv[0, 0, 2].isnan().all() and not dv[0, 0, [0, 1, 3, 4, 5]].isnan().any()
    assert dp_score.isnan().all()


def test_sigmoid_of_infinite_scores_is_one_and_zero(small_tiles):
    q, k, v, p_score, p_den = _inputs(2, 4, d=2, b=1, h=1)
    q[0, 0, 0] = torch.tensor([math.inf, 0.0])
    k[0, 0, :, 0] = torch.tensor([1.0, -1.0, 2.0, -3.0])  # +inf, -inf, +inf, -inf
    k[0, 0, :, 1] = 1.0
    do = torch.randn(1, 1, 2, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    out, _, _, dv, _, _ = _fused(q, k, v, p_score, p_den, do, 0.5, False, None, Weight.SIGMOID)
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0] + v[0, 0, 2], rtol=1e-15, atol=0)
    want = _reference_grads(q, k, v, p_score, p_den, do, 0.5, False, None, Weight.SIGMOID)
    torch.testing.assert_close(out, want[0], rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(dv, want[3], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(("weight", "hits"), [(Weight.SOFTMAX1, [0, 2, 4]),
                                              (Weight.STABLEMAX, [0, 2, 4]),
                                              (Weight.SYMAX, [0, 1, 2, 3, 4])],
                         ids=["softmax1", "stablemax", "symax"])
def test_an_infinite_weight_gives_the_mean_of_its_values(small_tiles, weight, hits):
    """+inf scores, and for symax -inf ones too, win: the mean of their values, dO/k to
    their dv, no dq; the other queries as the definition has them."""
    q, k, v, p_score, p_den = _inputs(3, 5, d=2, b=1, h=1)
    q[0, 0, 1] = torch.tensor([math.inf, 0.0])
    k[0, 0, :, 0] = torch.tensor([1.0, -1.0, 2.0, -3.0, 0.5])  # +inf, -inf, +inf, -inf, +inf
    k[0, 0, :, 1] = 1.0
    do = torch.randn(1, 1, 3, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    out, dq, _, dv, _, _ = _fused(q, k, v, p_score, p_den, do, 0.5, False, None, weight)
    torch.testing.assert_close(out[0, 0, 1], v[0, 0, hits].mean(0), rtol=1e-15, atol=0)
    finite = [0, 2]
    want = _reference_grads(q[:, :, finite], k, v, p_score, p_den, do[:, :, finite], 0.5, False,
                            None, weight)
    torch.testing.assert_close(out[:, :, finite], want[0], rtol=1e-12, atol=1e-13)
    extra = torch.zeros_like(dv)
    extra[0, 0, hits] = do[0, 0, 1] / len(hits)
    torch.testing.assert_close(dv, want[3] + extra, rtol=1e-12, atol=1e-13)
    assert torch.equal(dq[0, 0, 1], torch.zeros(2, dtype=F64))


def _run(ext, weight, q, k, v, causal, blocks=(4, 3)):
    b, h = q.shape[:2]
    p_score = torch.linspace(-1.0, 0.5, b * h, dtype=q.dtype).reshape(b, h)
    p_den = torch.linspace(0.0, 1.5, b * h, dtype=q.dtype).reshape(b, h)
    out, m, den = ext.attention_forward(q, k, v, p_score, p_den, 0.3, causal, *blocks, None,
                                        int(weight))
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=q.dtype)
    grads = ext.attention_backward(q, k, v, out, do, m, den, p_score, p_den, 0.3, causal, *blocks,
                                   None, int(weight))
    return (out, m, den, *grads)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_every_instruction_set_and_thread_count_agrees(dtype):
    """The widest set against every other (to rounding), and 1 against 3 threads in both
    backward schedules (bit for bit), for every weight."""
    ext = native.load()
    q, k, v = _inputs(21, 19, dtype=dtype)[:3]  # rows that end in vector tails
    tol = {F64: 1e-13, torch.float32: 2e-6}[dtype]
    threads = torch.get_num_threads()
    try:
        for weight in FAMILY:
            ext.set_isa(ext.isas()[0])
            want = _run(ext, weight, q, k, v, True)
            for isa in ext.isas()[1:]:
                ext.set_isa(isa)
                for a, b in zip(_run(ext, weight, q, k, v, True), want, strict=True):
                    torch.testing.assert_close(a, b, rtol=tol, atol=tol)
            ext.set_isa(ext.isas()[0])
            for heads in (1, 6):
                qh, kh, vh = (t[:1, :1].expand(1, heads, -1, -1).contiguous() for t in (q, k, v))
                torch.set_num_threads(1)
                one = _run(ext, weight, qh, kh, vh, True)
                torch.set_num_threads(3)
                for a, b in zip(_run(ext, weight, qh, kh, vh, True), one, strict=True):
                    assert torch.equal(a, b)
    finally:
        torch.set_num_threads(threads)
        ext.set_isa(ext.isas()[0])


def test_an_unknown_weight_is_refused():
    q, k, v, p_score, p_den = _inputs(2, 2)
    with pytest.raises(RuntimeError, match="unknown attention weight"):
        native.load().attention_forward(q, k, v, p_score, p_den, 0.5, False, 4, 4, None, 7)
    with pytest.raises(RuntimeError, match="unknown attention weight"):  # the extension's
        native_attention.forward(q, k, v, p_score, p_den, 0.5, False, None, 7)


def test_accepts_every_weight_on_cpu_tensors():
    q = torch.zeros(1, 1, 1, 1)
    assert all(native_attention.accepts(q, w) for w in Weight)
    assert native_attention.accepts(q)  # Elastic by default


@pytest.mark.parametrize(("function", "params"), [("softmax1", {}), ("symax", {"eta": 0.7}),
                                                  ("stablemax", {}), ("sigmoid", {"bias": -1.2})])
@pytest.mark.parametrize("causal", [0.0, 1.0])
def test_the_registered_kernels_follow_the_attention_contract(function, params, causal):
    """cpp_<f>_attention against torch's composite of the same function: out, then dq, dk, dv
    and the row parameter's gradient through step(dout), a key-padding mask given."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, n, 4)) for n in (5, 6, 6))
    dout = torch.from_numpy(rng.standard_normal((2, 2, 5, 4)))
    mask = np.ones((2, 1, 1, 6), dtype=bool)
    mask[1, ..., 4:] = False
    results = []
    for name in (f"cpp_{function}_attention", f"torch_{function}_attention_composite"):
        fwd, bwd = get_kernel(name), get_kernel(name, "bwd")
        assert fwd.function == f"{function}_attention"
        args, kw = kernel_arguments(fwd, q, k, v, {**params, "causal": causal}, "fp64", 0.5, mask)
        out = forward_output(fwd.fn(*args, **kw))
        args, kw = kernel_arguments(bwd, q, k, v, {**params, "causal": causal}, "fp64", 0.5, mask)
        results.append((out, *backward_step(bwd.fn(*args, **kw))(dout)))
    assert len(results[0]) == 4 + len(params)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
