"""Issue 57 item 1: an attention kernel may declare the own-format contract (accuracy="own"):
a 16-bit kernel that computes its scores, weights and weighted sum in its format is judged
by the attention budgets with that format's unit roundoff (numerics/budgets/attention_own.py,
docs/numerics.md section 9). The eager fixture (tests/fixtures/eager16_attention.py) passes
under it and fails under the wide one; a bug still fails under it; fp32 and fp64 keep the
wide allowance. Small fp16/bf16 slices of the default matrix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from elasticbench.harness.kinds.attention.verify_job import prepare, verify_attention_one
from elasticbench.harness.kinds.attention.verify_matrix import AttentionCase
from elasticbench.harness.numerics.budgets.attention_budgets import ATTENTION_BUDGETS
from elasticbench.harness.numerics.budgets.attention_own import attention_budget, work_format
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.registry import get_kernel, load_kernel_file, scoped_kernels

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "eager16_attention.py"

LN64 = -4.1588830833596715  # the matrix's sigmoid bias, -ln 64
DECODE, SMALL, SQUARE = (2, 2, 1, 24, 8), (1, 1, 12, 5, 8), (1, 2, 16, 16, 8)
# (function, mode, shape, params): per function and mode, a case of the default fp16 matrix
# (its seed, the normal input) where computing in fp16 costs more than the wide budget
# allows. symax and stablemax forward meet even the wide budget on the whole matrix (no
# exponential amplifies their scores' rounding), so they appear backward only.
SLICE = [
    ("elastic", "fwd", SMALL, (("tau", 0.01), ("beta", 0.0), ("causal", 0.0))),
    ("elastic", "bwd", SMALL, (("tau", 0.01), ("beta", 0.0), ("causal", 0.0))),
    ("softmax", "fwd", SQUARE, (("causal", 0.0),)),
    ("softmax", "bwd", DECODE, (("causal", 0.0),)),
    ("softmax1", "fwd", SQUARE, (("causal", 0.0),)),
    ("softmax1", "bwd", DECODE, (("causal", 0.0),)),
    ("symax", "bwd", DECODE, (("eta", 1.0), ("causal", 0.0))),
    ("stablemax", "bwd", DECODE, (("causal", 0.0),)),
    ("sigmoid", "fwd", DECODE, (("bias", LN64), ("causal", 1.0))),
    ("sigmoid", "bwd", SMALL, (("bias", LN64), ("causal", 0.0))),
    ("cog", "fwd", SQUARE, (("causal", 0.0),)),
    ("cog", "bwd", DECODE, (("causal", 0.0),)),
]


def _case(function, shape, params, dtype, generator="normal") -> AttentionCase:
    return AttentionCase(function=f"{function}_attention", generator=generator, shape=shape,
                         dtype=dtype, params=params, seed=20261123)


@pytest.fixture(scope="module")
def eager():
    with scoped_kernels():
        load_kernel_file(FIXTURE)
        yield {(f, m): get_kernel(f"eager16_{f}", m) for f in {s[0] for s in SLICE}
               for m in ("fwd", "bwd")}


@pytest.mark.parametrize("function, mode, shape, params", SLICE,
                         ids=[f"{s[0]}-{s[1]}" for s in SLICE])
def test_eager_fp16_attention_passes_own_and_fails_wide(eager, function, mode, shape,
                                                        params):
    spec = eager[function, mode]
    assert spec.accuracy == "own"
    prep = prepare(_case(function, shape, params, "fp16"), mode, None, 128)
    own = verify_attention_one(spec, prep)
    assert own.passed, own.reason
    assert own.accuracy == "own" and own.causal == "top_left"
    wide = verify_attention_one(replace(spec, accuracy="wide"), prep)
    assert not wide.passed and wide.accuracy == "wide"
    assert wide.reason.startswith("accuracy:"), wide.reason
    assert wide.max_budget_frac > 1 >= own.max_budget_frac


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("generator", ["huge", "nan_k", "inf_scores"])
def test_eager_16_bit_attention_passes_own_where_scores_are_huge_or_special(
        eager, generator, dtype):
    # huge: scores in the hundreds at tau = 0.01, where a score's fp16 rounding (0.25 at
    # 300) moves z by 25: the weight of a key far below the maximum comes out of order 1,
    # which the own budget allows only past first order (attention_own.py); nan_k and
    # inf_scores: NaN and the limits, forward and through autograd
    params = (("tau", 0.01), ("beta", 0.0), ("causal", 0.0))
    shape = SQUARE if generator == "huge" else (1, 2, 8, 8, 4)
    case = _case("elastic", shape, params, dtype, generator)
    for mode in ("fwd", "bwd"):
        record = verify_attention_one(eager["elastic", mode], prepare(case, mode, None, 128))
        assert record.passed, (mode, record.reason)


def test_a_bug_still_fails_under_own(eager):
    """The offset added without its exp(-m/tau) (the classic Elastic bug), in fp16, declared
    own: far outside even the own budget."""
    fn = eager["elastic", "fwd"].fn
    scores, family, out = (fn.__globals__[n] for n in ("_scores", "_exp_family", "_out"))

    def unrescaled(q, k, v, *, scale, causal, tau, beta):
        s, seen = scores(q, k, scale, causal)
        t, b = tau[..., None, None], beta[..., None, None]
        return out(family(s, seen, t, lambda m, inv: b, True, True), v)

    bad = replace(eager["elastic", "fwd"], name="unrescaled", fn=unrescaled)
    case = _case("elastic", SQUARE, (("tau", 1.0), ("beta", 1.0), ("causal", 0.0)), "fp16")
    record = verify_attention_one(bad, prepare(case, "fwd", None, 128))
    assert not record.passed and record.reason.startswith("accuracy: out"), record.reason
    assert record.max_budget_frac > 4


def test_own_is_wide_for_fp32_and_fp64_and_the_16_bit_unit_otherwise():
    for name in ("fp32", "fp64"):
        assert work_format(get_format(name), "own") is None
        assert attention_budget(get_format(name), "own") == ATTENTION_BUDGETS[name]
    assert work_format(get_format("fp16"), "own") == get_format("fp16")
    assert work_format(get_format("bf16"), "wide") is None
    composite = get_kernel("torch_attention_composite")
    case = _case("elastic", (1, 2, 8, 8, 4), (("tau", 0.5), ("beta", 1.0), ("causal", 1.0)),
                 "fp32")
    prep = prepare(case, "fwd", None, 128)
    wide = verify_attention_one(composite, prep)
    own = verify_attention_one(replace(composite, accuracy="own"), prep)
    assert wide.passed and own.passed and own.accuracy == "own"
    assert own.max_budget_frac == wide.max_budget_frac


def test_an_attention_kernel_may_declare_own():
    from elasticbench.harness.registry import register_kernel

    with scoped_kernels():
        @register_kernel(function="softmax_attention", backend="torch", name="own_declared",
                         accuracy="own", compiles=False)
        def own_declared(q, k, v, *, scale, causal):
            s = (q @ k.transpose(-1, -2)) * scale
            return torch.softmax(s, -1) @ v

        spec = get_kernel("own_declared")
        assert spec.accuracy == "own"
        case = _case("softmax", (1, 1, 4, 4, 4), (("causal", 0.0),), "fp16")
        record = verify_attention_one(spec, prepare(case, "fwd", None, 128))
    assert record.passed, record.reason
    assert np.isclose(record.budget["a"], 4.0)
