"""Issue 57 item 3: an attention kernel gets its row parameters in the form it declares
(param_form): (batch, heads) arrays in the working precision (the default), Python floats,
or arrays in the case's own format, the reference then using the rounded values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elasticbench.harness.kinds.attention.verify_job import prepare, verify_attention_one
from elasticbench.harness.kinds.attention.verify_matrix import AttentionCase
from elasticbench.harness.registry import get_kernel, register_kernel, scoped_kernels

BF16_TENTH = 0.10009765625  # 0.1 rounded to bf16


def _case(tau: float) -> AttentionCase:
    return AttentionCase(function="elastic_attention", generator="normal",
                         shape=(1, 2, 4, 4, 8), dtype="bf16",
                         params=(("tau", tau), ("beta", 1.0), ("causal", 0.0)), seed=3)


def _register(form: str, seen: list) -> None:
    """An fp64 wrapper of the eager composite that notes the parameters it was given."""
    composite = get_kernel("torch_attention_composite").fn

    @register_kernel(function="elastic_attention", backend="torch", name=f"form_{form}",
                     param_form=form, compiles=False)
    def kernel(q, k, v, *, scale, causal, tau, beta):
        seen.append((tau, beta))
        wide = [t.double() for t in (q, k, v)]
        heads = [torch.as_tensor(p, dtype=torch.float64).expand(q.shape[:2])
                 for p in (tau, beta)]
        out = composite(*wide, scale=scale, causal=causal, tau=heads[0], beta=heads[1])
        return (out[0] if isinstance(out, tuple) else out).to(q.dtype)


def test_a_float_kernel_gets_floats_and_the_case_as_it_is():
    seen: list = []
    with scoped_kernels():
        _register("float", seen)
        prep = prepare(_case(0.1), "fwd", None, 128)
        record = verify_attention_one(get_kernel("form_float"), prep)
    assert seen == [(0.1, 1.0)]
    assert record.passed, record.reason
    assert record.params["tau"] == 0.1


def test_an_own_format_kernel_gets_rounded_arrays_and_a_reference_with_them():
    seen: list = []
    with scoped_kernels():
        _register("own", seen)
        prep = prepare(_case(0.1), "fwd", None, 128)
        record = verify_attention_one(get_kernel("form_own"), prep)
    (tau, beta), = seen
    assert tau.dtype == torch.bfloat16 and tau.shape == (1, 2)
    assert float(tau[0, 0]) == BF16_TENTH and beta.dtype == torch.bfloat16
    # judged against the reference of the value it was given, and the record says which
    assert record.passed, record.reason
    assert record.params["tau"] == BF16_TENTH


def test_the_default_form_is_unchanged_and_a_bad_form_is_refused():
    seen: list = []
    with scoped_kernels():
        _register("heads", seen)
        verify_attention_one(get_kernel("form_heads"), prepare(_case(0.5), "fwd", None, 128))
        with pytest.raises(ValueError, match="unknown param_form 'half'"):
            register_kernel(function="elastic_attention", backend="torch", name="x",
                            param_form="half")
        with pytest.raises(ValueError, match="param_form is for attention kernels"):
            register_kernel(function="elastic", backend="numpy", name="x", param_form="float")
    (tau, _), = seen
    assert tau.dtype == torch.float32 and np.allclose(tau.numpy(), 0.5)
