"""Attention kernels in the one registry: their kind, how they are chosen, and the contract
of docs/attention.md section 4 as the built-in torch kernels follow it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elasticbench.attention_contract import (
    backward_step,
    forward_output,
    head_arrays,
    kernel_arguments,
)
from elasticbench.functions import ATTENTION, ROW, function_kind, get_attention_function
from elasticbench.registry import (
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
                                                             "causal": 1.0}
    with pytest.raises(ValueError, match="causal must be 0 or 1"):
        fn.validate_params({"causal": 0.5})
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
