"""Masked cases of the attention verification (docs/attention.md section 5): the mask
inputs, the reference under a mask (certified against mpmath, and both against a float64
torch composite), which kernels are given a masked case, that the kernels taking masks pass
and that a kernel ignoring the mask fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elasticbench.attention.composite import elastic_attention_composite
from elasticbench.harness.functions import get_attention_function
from elasticbench.harness.kinds.attention.kernel_contract import mask_argument
from elasticbench.harness.kinds.attention.qkv_inputs import (
    ATTENTION_MASKS,
    generate_mask,
    generate_qkv,
    mask_bias,
)
from elasticbench.harness.kinds.attention.verify_job import (
    AttentionCase,
    prepare,
    verify_attention_one,
)
from elasticbench.harness.numerics.truth import attention_truth as at
from elasticbench.harness.registry import KernelSpec, get_kernel

EA = get_attention_function("elastic_attention")
SHAPE = (2, 2, 6, 7, 4)
MASKS = sorted(ATTENTION_MASKS)


def _inputs(gen: str, causal: float = 0.0, seed: int = 5):
    q, k, v = (a.astype(np.float64) for a in generate_qkv(gen, "fp64", SHAPE, seed))
    mask = generate_mask(gen, "fp64", SHAPE, seed)
    dout = np.random.default_rng(seed).standard_normal((*SHAPE[:3], SHAPE[4]))
    return {"tau": 0.6, "beta": 0.5, "causal": causal}, q, k, v, mask, dout


@pytest.mark.parametrize("gen", MASKS)
def test_every_mask_input_leaves_some_query_with_no_key(gen):
    params, q, k, v, mask, _dout = _inputs(gen)
    truth = at.evaluate(EA, params, q, k, v, 0.5, None, bias=mask_bias(mask, SHAPE))
    assert (truth.kind == "masked").any() and (truth.kind == "finite").any()
    if gen == "additive_mask":  # finite, and it flips some scores' signs
        s = 0.5 * q @ np.swapaxes(k, -1, -2)
        assert np.isfinite(mask).all() and ((s + mask >= 0) != (s >= 0)).any()


@pytest.mark.parametrize("causal", [0.0, 1.0])
@pytest.mark.parametrize("gen", MASKS)
def test_the_reference_under_a_mask_is_the_oracle_and_the_composite(gen, causal):
    params, q, k, v, mask, dout = _inputs(gen, causal)
    bias = mask_bias(mask, SHAPE)
    truth = at.evaluate(EA, params, q, k, v, 0.5, dout, bias=bias)
    oracle = at.oracle_evaluate(EA, params, q, k, v, 0.5, dout, bias=bias)
    assert (truth.kind == oracle.kind).all() and (truth.out_zero == oracle.out_zero).all()
    for name in ("out", "dq", "dk", "dv", "dp"):
        np.testing.assert_allclose(getattr(truth, f"{name}_hi"), getattr(oracle, f"{name}_hi"),
                                   rtol=1e-15, atol=1e-300, err_msg=name)
    leaves = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
    tau, beta = (torch.tensor(params[n], dtype=torch.float64, requires_grad=True)
                 for n in ("tau", "beta"))
    out = elastic_attention_composite(*leaves, tau=tau, beta=beta, scale=0.5,
                                      causal=bool(causal), attn_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(out.detach().numpy(), truth.out_hi, rtol=1e-12, atol=1e-14)
    grads = torch.autograd.grad(out, [*leaves, tau, beta], torch.from_numpy(dout))
    wants = (truth.dq_hi, truth.dk_hi, truth.dv_hi, truth.dp_hi[..., 0].sum(),
             truth.dp_hi[..., 1].sum())
    for g, w in zip(grads, wants, strict=True):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-10, atol=1e-12)


def test_a_kernel_is_given_the_masks_it_declares():
    pad = generate_mask("key_padding", "fp32", SHAPE, 1)
    general = generate_mask("bool_mask", "fp32", SHAPE, 1)
    composite = get_kernel("torch_attention_composite", "fwd")
    fused = get_kernel("torch_attention_flash", "fwd")
    assert mask_argument(composite, general) == {"attn_mask": general}
    assert mask_argument(fused, general) is None
    assert mask_argument(fused, pad)["key_mask"].shape == (2, 7)
    assert mask_argument(get_kernel("sdpa", "fwd"), pad) == {"attn_mask": pad}
    assert mask_argument(KernelSpec("plain", "elastic_attention", "torch",
                                    lambda q, k, v, **kw: q), pad) is None
    assert mask_argument(fused, None) == {}


def _case(gen: str, dtype: str, causal: float) -> AttentionCase:
    return AttentionCase("elastic_attention", gen, SHAPE, dtype,
                         (("tau", 0.5), ("beta", 1.0), ("causal", causal)), 7)


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("gen", MASKS)
def test_kernels_that_take_the_mask_pass(gen, dtype, mode):
    prep = prepare(_case(gen, dtype, 1.0), mode, None, 128)
    names = ["torch_attention_composite", "torch_attention_flash", "cpp_attention"]
    specs = [get_kernel(n, mode) for n in names]
    taken = [s for s in specs if mask_argument(s, prep.mask) is not None
             and (s.backend != "cpp" or _native())]
    assert taken
    for spec in taken:
        record = verify_attention_one(spec, prep)
        assert record.passed, (spec.name, record.reason)


def _native() -> bool:
    from elasticbench import devices

    return devices.native_unavailable() is None


def test_a_kernel_that_ignores_the_key_mask_fails():
    from elasticbench.attention import flash

    def ignores(q, k, v, *, tau, beta, scale, causal, key_mask=None):
        return flash.forward(q, k, v, tau, beta, scale, causal)

    spec = KernelSpec("ignores_mask", "elastic_attention", "torch", ignores)
    record = verify_attention_one(spec, prepare(_case("key_padding", "fp32", 0.0), "fwd",
                                                None, 128))
    assert not record.passed
