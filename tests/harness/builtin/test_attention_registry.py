"""Attention kernels in the one registry: their kind, how they are chosen, and the contract
of docs/attention.md section 4 as the built-in torch kernels follow it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elasticbench.harness.functions import ATTENTION, ROW, function_kind, get_attention_function
from elasticbench.harness.kinds.attention.kernel_contract import (
    backward_step,
    forward_output,
    head_arrays,
    kernel_arguments,
)
from elasticbench.harness.registry import (
    get_kernel,
    list_kernels,
    register_kernel,
    scoped_kernels,
    select_kernels,
)


def test_kinds_and_default_selection_leave_attention_kernels_out():
    assert function_kind("elastic") == ROW and function_kind("elastic_attention") == ATTENTION
    with pytest.raises(ValueError, match="unknown function"):
        function_kind("attention")
    attention = {k.name for k in list_kernels() if k.kind == ATTENTION}
    assert {"torch_attention_composite", "torch_attention_flash", "sdpa"} <= attention
    default = {k.name for k in select_kernels()}
    assert default and not default & attention
    chosen = {k.name for k in select_kernels(functions=["elastic_attention"])}
    assert chosen == {k.name for k in list_kernels("elastic_attention", mode="fwd")
                      if not k.baseline}
    assert [k.name for k in select_kernels(only=["sdpa"])] == ["sdpa"]


def test_any_backend_registers_an_attention_kernel_and_bad_params_are_refused():
    with scoped_kernels():
        @register_kernel(function="elastic_attention", backend="numpy", name="np_attn")
        def np_attn(q, k, v, *, tau, beta, scale, causal):
            return q

        assert get_kernel("np_attn").kind == ATTENTION
        assert get_kernel("np_attn").backend == "numpy"
    with pytest.raises(ValueError, match="unknown kernel"):
        get_kernel("np_attn")
    fn = get_attention_function("elastic_attention")
    assert fn.validate_params({"tau": 0.5, "causal": 1}) == {"tau": 0.5, "beta": 1.0,
                                                             "causal": 1.0, "gate": 0.0}
    with pytest.raises(ValueError, match="causal must be 0 or 1"):
        fn.validate_params({"causal": 0.5})
    with pytest.raises(ValueError, match="gate must be 0 or 1"):
        fn.validate_params({"gate": 2})
    with pytest.raises(ValueError, match="no parameter"):
        get_attention_function("softmax_attention").validate_params({"tau": 1})


def test_head_arrays_are_per_batch_and_head_in_the_working_precision():
    a = head_arrays({"tau": 0.5, "beta": 2.0, "causal": 1.0}, ("tau", "beta"), 2, 3, "bf16")
    assert set(a) == {"tau", "beta"} and a["tau"].shape == (2, 3)
    assert a["tau"].dtype == np.float32 and (a["beta"] == 2.0).all()
    assert head_arrays({"tau": 1.0}, ("tau",), 1, 1, "fp64")["tau"].dtype == np.float64


@pytest.mark.parametrize("causal", [0.0, 1.0])
def test_torch_kernels_follow_the_contract_and_agree(causal):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, n, 4)) for n in (5, 6, 6))
    dout = rng.standard_normal((1, 2, 5, 4))
    params = {"tau": 0.7, "beta": 0.4, "causal": causal}
    outs, grads = [], []
    for name in ("torch_attention_composite", "torch_attention_flash"):
        args, kw = kernel_arguments(get_kernel(name), q, k, v, params, "fp64", 0.5)
        outs.append(forward_output(get_kernel(name).fn(*args, **kw)))
        args, kw = kernel_arguments(get_kernel(name, "bwd"), q, k, v, params, "fp64", 0.5)
        step = backward_step(get_kernel(name, "bwd").fn(*args, **kw))
        grads.append(step(torch.from_numpy(dout)))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-13, atol=1e-14)
    assert len(grads[0]) == len(grads[1]) == 5 and grads[0][3].shape == (1, 2)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    args, kw = kernel_arguments(get_kernel("sdpa"), q, k, v, {"causal": causal}, "fp64", 0.5)
    assert set(kw) == {"scale", "causal"}
    want = torch.nn.functional.scaled_dot_product_attention(*args, scale=0.5,
                                                            is_causal=bool(causal))
    assert torch.equal(get_kernel("sdpa").fn(*args, **kw), want)
    with pytest.raises(TypeError, match="step"):
        backward_step(outs[0])


# The family's kernels come from one table (elasticbench/harness/builtin/attention_family.py): each registering
# module hands over its implementation, and the table names, describes and wraps it.


def test_the_family_table_registers_each_kernel_as_the_contract_reads_it():
    import inspect
    import pickle
    import sys

    from elasticbench.harness.builtin.attention_family import FAMILY

    registered = {(k.name, k.mode): k for k in list_kernels()}  # loads the built-ins
    where = {"composite": ("torch_attention", "COMPOSITE"), "flash": ("torch_attention", "FLASH"),
             "cpp": ("cpp_attention", "CPP"), "triton": ("triton_attention", "TRITON")}
    checked = 0
    for member in FAMILY:
        assert set(member.params) == set(get_attention_function(member.function).row_params)
        for key, (fwd_doc, bwd_doc) in member.kernels.items():
            module = f"elasticbench.harness.builtin.{where[key][0]}"
            if module not in sys.modules:  # its backend is not available here
                continue
            impl = getattr(sys.modules[module], where[key][1])
            name = member.name(impl)
            for mode, doc in (("fwd", fwd_doc), ("bwd", bwd_doc)):
                spec = registered[name, mode]
                assert (spec.function, spec.backend, spec.description) == (
                    member.function, impl.backend, doc)
                assert list(inspect.signature(spec.fn).parameters) == [
                    "q", "k", "v", *member.params, "scale", "causal", impl.mask,
                    *(("gate",) if impl.gated else ())]
                assert spec.fn.__module__ == module
                assert pickle.loads(pickle.dumps(spec.fn)) is spec.fn
                checked += 1
    assert checked >= 2 * 2 * len(FAMILY)  # the composite and the tiled code at least
    assert {("torch_attention_composite", "bwd"), ("torch_symax_attention_flash", "fwd"),
            ("torch_sigmoid_attention_composite", "fwd")} <= set(registered)
    assert "attn_mask" in inspect.signature(get_kernel("torch_attention_composite").fn).parameters


def _fake_fused(calls: list) -> object:
    """A fused implementation that records its calls and returns marked gradients."""
    from elasticbench.harness.builtin.attention_family import Implementation

    def forward(q, k, v, p_score, p_den, scale, causal, mask, weight):
        calls.append((p_score, p_den, mask, weight))
        return q * 2, torch.zeros(q.shape[:3]), torch.ones(q.shape[:3])

    def backward(q, k, v, out, dout, m, den, p_score, p_den, scale, causal, mask, weight):
        heads = torch.ones(q.shape[:2])
        return dout, dout + 1, dout + 2, heads * 10, heads * 11

    return Implementation("cpp", "torch", "fake", forward, backward)


def test_a_fused_kernel_fills_the_unused_slot_and_returns_the_used_gradients():
    from elasticbench.attention.weights import Weight
    from elasticbench.harness.builtin.attention_family import register_family

    calls: list = []
    namespace = {"__name__": "fake_module"}
    q = torch.ones(2, 3, 4, 5, dtype=torch.float64)
    eta, bias, keep = torch.full((2, 3), 0.5), torch.full((2, 3), 0.25), torch.ones(2, 4) > 0
    with scoped_kernels():
        register_family(_fake_fused(calls), namespace)
        assert sorted(namespace) == sorted(["__name__", *(
            f"fake_{f}{suffix}" for f in ("attention", "softmax1_attention", "symax_attention",
                                          "stablemax_attention", "sigmoid_attention",
                                          "cog_attention")
            for suffix in ("", "_bwd"))])
        symax = get_kernel("fake_symax_attention", "bwd")
        assert symax.fn.__name__ == "fake_symax_attention_bwd"
        dq, dk, dv, deta = symax.fn(q, q, q, eta=eta, scale=0.5, causal=False,
                                    key_mask=keep)(q)
        assert torch.equal(dq, q) and torch.equal(dk, q + 1) and torch.equal(dv, q + 2)
        assert torch.equal(deta, torch.full((2, 3), 11.0))
        p_score, p_den, mask, weight = calls[-1]
        assert weight is Weight.SYMAX and p_den is eta and mask is keep
        assert torch.equal(p_score, torch.zeros(2, 3)) and p_score.dtype == eta.dtype
        grads = get_kernel("fake_sigmoid_attention", "bwd").fn(q, q, q, bias=bias, scale=0.5,
                                                               causal=True)(q)
        assert len(grads) == 4 and torch.equal(grads[3], torch.full((2, 3), 10.0))
        assert calls[-1][0] is bias and calls[-1][2] is None
        out, _, _ = get_kernel("fake_softmax1_attention").fn(q, q, q, scale=0.5, causal=False)
        assert torch.equal(out, q * 2)
        p_score, p_den, _, weight = calls[-1]  # neither slot given: (batch, heads) zeros in fp64
        assert weight is Weight.SOFTMAX1 and p_score.shape == (2, 3)
        assert p_score.dtype == torch.float64
        assert len(get_kernel("fake_attention", "bwd").fn(
            q, q, q, tau=eta, beta=bias, scale=0.5, causal=False)(q)) == 5
        with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'eta'"):
            symax.fn(q, q, q, scale=0.5, causal=False)
        with pytest.raises(TypeError, match="unexpected keyword argument 'tau'"):
            get_kernel("fake_symax_attention").fn(q, q, q, eta=eta, tau=eta, scale=0.5,
                                                  causal=False)
    with pytest.raises(ValueError, match="unknown kernel"):
        get_kernel("fake_symax_attention")


def test_a_differentiable_kernel_gets_autograds_gradients_of_the_used_slots():
    from elasticbench.harness.builtin.attention_family import Implementation, register_family

    seen: list = []

    def forward(q, k, v, p_score, p_den, scale, causal, mask, weight):
        seen.append((p_score, p_den))
        return q * p_score[:, :, None, None] * scale + k * v

    impl = Implementation("composite", "torch", "fake", forward, suffix="_eager",
                          mask="attn_mask")
    g = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64)
                     for _ in range(4))
    bias = torch.tensor([[0.5, -2.0]], dtype=torch.float64)
    with scoped_kernels():
        register_family(impl, {"__name__": "fake_module"}, ["sigmoid_attention"])
        assert [k.name for k in list_kernels(backend="torch") if k.name.startswith("fake")] == [
            "fake_sigmoid_attention_eager"] * 2
        dq, dk, dv, dbias = get_kernel("fake_sigmoid_attention_eager", "bwd").fn(
            q, k, v, bias=bias, scale=0.5, causal=False)(dout)
    assert seen[-1][1] is None and seen[-1][0] is not bias  # a leaf, not the tensor itself
    torch.testing.assert_close(dq, dout * bias[:, :, None, None] * 0.5, rtol=0, atol=0)
    torch.testing.assert_close(dk, dout * v, rtol=0, atol=0)
    torch.testing.assert_close(dv, dout * k, rtol=0, atol=0)
    torch.testing.assert_close(dbias, (dout * q * 0.5).sum((2, 3)), rtol=1e-15, atol=0)
    assert not q.requires_grad and bias.grad is None  # the caller's tensors are untouched


def test_a_gated_call_gates_the_output_and_returns_d_gate_after_the_gradients():
    from elasticbench.attention.weights import Weight
    from elasticbench.harness.builtin.attention_family import Implementation, register_family

    calls: list = []

    def forward(q, k, v, p_score, p_den, scale, causal, mask, weight, gate=None,
                keep_ungated=False):
        out = q * 2
        calls.append(("fwd", gate, keep_ungated))
        if gate is None:
            return out, torch.zeros(q.shape[:3]), torch.ones(q.shape[:3])
        return (out * gate, torch.zeros(q.shape[:3]), torch.ones(q.shape[:3]),
                *((out,) if keep_ungated else ()))

    def backward(q, k, v, out, dout, m, den, p_score, p_den, scale, causal, mask, weight):
        calls.append(("bwd", out, dout, weight))
        heads = torch.zeros(q.shape[:2])
        return dout * 3, dout * 4, dout * 5, heads, heads

    fused = Implementation("cpp", "torch", "gfake", forward, backward)
    composite = Implementation(
        "composite", "torch", "gfake",
        lambda q, k, v, p_score, p_den, scale, causal, mask, weight: q * k + v,
        suffix="_eager", mask="attn_mask")
    assert fused.gated and composite.gated
    assert not Implementation("cpp", "torch", "x", lambda *a: a, backward).gated
    g = torch.Generator().manual_seed(2)
    q, gate, dy = (torch.rand(1, 2, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    with scoped_kernels():
        register_family(fused, {"__name__": "fake_module"}, ["cog_attention"])
        register_family(composite, {"__name__": "fake_module"}, ["cog_attention"])
        out, _, _ = get_kernel("gfake_cog_attention").fn(q, q, q, scale=0.5, causal=False,
                                                         gate=gate)
        assert torch.equal(out, q * 2 * gate) and calls[-1] == ("fwd", gate, False)
        dq, _, _, dgate = get_kernel("gfake_cog_attention", "bwd").fn(
            q, q, q, scale=0.5, causal=False, gate=gate)(dy)
        _, ungated, dout, weight = calls[-1]
        assert weight is Weight.COG and torch.equal(ungated, q * 2)
        assert torch.equal(dout, dy * gate) and torch.equal(dq, dy * gate * 3)
        assert torch.equal(dgate, dy * q * 2)
        assert len(get_kernel("gfake_cog_attention", "bwd").fn(
            q, q, q, scale=0.5, causal=False)(dy)) == 3  # ungated: no d gate
        k = q + 1
        out = get_kernel("gfake_cog_attention_eager").fn(q, k, q, scale=0.5, causal=False,
                                                         gate=gate)
        assert torch.equal(out, (q * k + q) * gate)
        dq, _, dv, dgate = get_kernel("gfake_cog_attention_eager", "bwd").fn(
            q, k, q, scale=0.5, causal=False, gate=gate)(dy)
        torch.testing.assert_close(dv, dy * gate, rtol=0, atol=0)
        torch.testing.assert_close(dgate, dy * (q * k + q), rtol=0, atol=0)
        torch.testing.assert_close(dq, dy * gate * k, rtol=0, atol=0)
