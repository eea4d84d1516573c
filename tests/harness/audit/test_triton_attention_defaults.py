"""The attention configurations a call launches by default, compiled for sm_90a.

Where no table names a key, a call launches the rule's configuration (the first its list
offers: kernels/triton/attention_configs.py). Each weight's rule configuration for every
kernel, causal or not (the causal forward also gated, as a gated call compiles its own), in
bf16 at head dim 128 (fp16 takes the same tiles) and in fp32 at head dim 64, is compiled here and must take wgmma (16-bit), fit in shared memory and not
spill. This runs on the pinned Triton in CI's ci step and on the GPU machines' Triton in its
second-Triton step (tests/harness/audit/test_triton_versions.py). Every other offered configuration is
compiled by `elasticbench audit --attention`, whose committed results
(results/triton-audit/attention-triton-*.json) tests/harness/audit/test_triton_audit.py reads: compiling all
of them here took most of CI's time.
"""

from __future__ import annotations

import pytest

from elasticbench import devices

pytestmark = [pytest.mark.needs("triton"), pytest.mark.ci,
              pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION"),
              pytest.mark.skipif(devices.triton_interpreted(),
                                 reason="compiles for a GPU: not under the interpreter")]

WEIGHTS = ("ELASTIC", "SOFTMAX1", "SYMAX", "STABLEMAX", "SIGMOID", "COG")


@pytest.mark.parametrize("weight", WEIGHTS)
@pytest.mark.parametrize("kernel", ["fwd", "dkdv", "dq"])
@pytest.mark.parametrize(("dtype_name", "head_dim"), [("bfloat16", 128), ("float32", 64)])
def test_the_rule_s_configuration_compiles_cleanly(weight, kernel, dtype_name, head_dim):
    import torch

    from elasticbench.attention.weights import Weight
    from elasticbench.harness.audit.attention_tiles import compile_report
    from elasticbench.kernels.triton import attention_configs as ac

    assert devices.triton_installed()
    dtype = getattr(torch, dtype_name)
    w = Weight[weight]
    bad = []
    # a gated call compiles its own forward (the epilogue's gate load and second store):
    # compiled causal, whose loop holds the most beside it (the epilogue is the same either
    # way, and the loop's cost without the gate is the ungated compile's)
    for causal in (False, True):
        tiles = ac.rule(ac.offered(kernel, head_dim, dtype, causal, w))
        for gate in (False, True) if kernel == "fwd" and causal else (False,):
            report = compile_report(kernel, head_dim, dtype, causal, tiles, weight=w,
                                    gate=gate)
            assert report.weight == weight.lower()
            if report.problems():
                bad.append(f"causal={causal} gate={gate} {tiles}: "
                           f"{', '.join(report.problems())}")
    assert not bad, bad
