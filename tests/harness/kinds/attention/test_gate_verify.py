"""Gated attention cases (docs/attention.md section 5): the gate a case gives, who is given
it, and the verdicts: a kernel that gates correctly passes forward and backward (d gate
included), one that leaves the gate out or returns a wrong d gate fails, and a kernel that
does not declare `gate` is not given gated cases. Tiny shapes throughout."""

from __future__ import annotations

import numpy as np
import torch

from elasticbench.harness.builtin import torch_attention
from elasticbench.harness.kinds.attention.gating import is_gated, takes_gate
from elasticbench.harness.kinds.attention.qkv_inputs import generate_gate
from elasticbench.harness.kinds.attention.verify_job import (
    AttentionVerifyJob,
    prepare,
    verify_attention_one,
)
from elasticbench.harness.kinds.attention.verify_matrix import AttentionCase
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.numerics.truth.row_truth import DEFAULT_PRECISION
from elasticbench.harness.registry import KernelSpec

SHAPE = (1, 2, 5, 6, 4)


def _case(function: str = "cog_attention", dtype: str = "fp32", gate: float = 1.0,
          gen: str = "normal", **params: float) -> AttentionCase:
    return AttentionCase(function, gen, SHAPE, dtype,
                         tuple({**params, "causal": 1.0, "gate": gate}.items()), 7)


def test_the_gate_is_in_the_open_unit_interval_reproducible_and_reaches_both_ends():
    for dtype in ("fp64", "fp32", "fp16", "bf16"):
        g = generate_gate("normal", dtype, SHAPE, 7).astype(np.float64)
        assert g.shape == (1, 2, 5, 4) and ((g > 0) & (g < 1)).all()
        assert g[:, :, 0].min() < 1e-3 and g[:, :, 0].max() > 0.99
        np.testing.assert_array_equal(g, generate_gate("normal", dtype, SHAPE, 7))
        assert g.dtype == np.float64 and get_format(dtype).cast(g).astype(np.float64).tolist() \
            == g.tolist()


def _spec(name: str, fn, mode: str = "fwd") -> KernelSpec:
    return KernelSpec(name, "cog_attention", "torch", fn, mode, "test")


def test_a_gated_kernel_passes_and_one_that_drops_the_gate_fails():
    fwd = torch_attention.torch_cog_attention_flash
    assert takes_gate(_spec("flash", fwd))
    for dtype in ("fp64", "fp32", "bf16"):
        prep = prepare(_case(dtype=dtype), "fwd", None, DEFAULT_PRECISION)
        assert prep.gate is not None
        r = verify_attention_one(_spec("flash", fwd), prep)
        assert r.passed, r.reason
        assert r.params["gate"] == 1.0

    def ungated(q, k, v, *, scale, causal, key_mask=None, gate=None):
        return fwd(q, k, v, scale=scale, causal=causal, key_mask=key_mask)
    prep = prepare(_case(), "fwd", None, DEFAULT_PRECISION)
    r = verify_attention_one(_spec("ungated", ungated), prep)
    assert not r.passed and r.reason.startswith("accuracy: out")


def test_the_gated_backward_returns_d_gate_and_a_wrong_one_fails():
    bwd = torch_attention.torch_cog_attention_flash_bwd
    for dtype in ("fp64", "fp32", "fp16"):
        prep = prepare(_case(dtype=dtype), "bwd", None, DEFAULT_PRECISION)
        r = verify_attention_one(_spec("flash", bwd, "bwd"), prep)
        assert r.passed, r.reason

    def wrong_dgate(q, k, v, *, scale, causal, key_mask=None, gate=None):
        step = bwd(q, k, v, scale=scale, causal=causal, key_mask=key_mask, gate=gate)

        def wrong(dout: torch.Tensor):
            *grads, dgate = step(dout)
            return (*grads, dgate * (1 + 1e-3))
        return wrong
    prep = prepare(_case(), "bwd", None, DEFAULT_PRECISION)
    r = verify_attention_one(_spec("wrong", wrong_dgate, "bwd"), prep)
    assert not r.passed and "dgate" in r.reason

    def no_dgate(q, k, v, *, scale, causal, key_mask=None, gate=None):
        step = bwd(q, k, v, scale=scale, causal=causal, key_mask=key_mask, gate=gate)
        return lambda dout: step(dout)[:-1]
    r = verify_attention_one(_spec("short", no_dgate, "bwd"), prep)
    assert not r.passed and "must return 4 gradients" in r.reason


def test_kernels_without_a_gate_parameter_get_no_gated_case():
    def plain(q, k, v, *, scale, causal):
        return q

    def gated(q, k, v, *, scale, causal, gate=None):
        return q
    specs = [_spec("plain", plain), _spec("gated", gated)]
    assert [takes_gate(s) for s in specs] == [False, True]
    job = AttentionVerifyJob({"fwd": specs}, {"fwd": []}, cache_dir=None,
                             precision=DEFAULT_PRECISION, isolation=None)  # type: ignore
    on, off = _case(), _case(gate=0.0)
    assert is_gated(on) and not is_gated(off)
    assert [s.name for s in job._todo("fwd", on, set())] == ["gated"]
    assert [s.name for s in job._todo("fwd", off, set())] == ["plain", "gated"]


def test_gated_elastic_attention_passes_through_the_composite():
    case = _case("elastic_attention", tau=0.5, beta=1.0)
    for mode, fn in (("fwd", torch_attention.torch_attention_composite),
                     ("bwd", torch_attention.torch_attention_composite_bwd)):
        prep = prepare(case, mode, None, DEFAULT_PRECISION)
        spec = KernelSpec("composite", "elastic_attention", "torch", fn, mode, "test")
        r = verify_attention_one(spec, prep)
        assert r.passed, r.reason
