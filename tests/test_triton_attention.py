"""The Triton attention kernel: verified under the interpreter against the exact reference,
and compiled for sm_90 and sm_80 without a GPU (docs/attention.md sections 5 and 7).

As in tests/test_triton.py, the interpreter must be on before `triton.jit` decorates the
kernel, so in an ordinary run one test re-runs this module with TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from elasticbench import devices

pytestmark = pytest.mark.needs("triton")


if not devices.triton_interpreted():

    def test_triton_attention_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__)

    @pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
    @pytest.mark.parametrize(("dtype", "causal", "arch"), [(torch.float32, True, 90),
                                                           (torch.bfloat16, False, 80)])
    def test_triton_attention_compiles_for_the_gpus_it_is_written_for(dtype, causal, arch):
        from elasticbench.audit.capture import capture_launches
        from elasticbench.audit.kernel_files import CompileCache, compile_one
        from elasticbench.kernels.triton.attention import attention_backward, attention_forward

        q = torch.zeros(1, 8, 1024, 64, dtype=dtype)
        heads = torch.ones(1, 8)
        stats = torch.zeros(1, 8, 1024)
        with capture_launches() as launches:
            attention_forward(q, q, q, heads, heads, 0.125, causal)
            attention_backward(q, q, q, q, q, stats, stats + 1, heads, heads, 0.125, causal)
        assert [launch.name for launch in launches] == [
            "attention_forward_kernel", "attention_dkdv_kernel", "attention_dq_kernel"]
        for launch in launches:
            compiled = compile_one(launch, arch, CompileCache(None))
            assert compiled.error is None and 0 < compiled.regs <= 255, compiled

else:
    from elasticbench.registry import get_kernel
    from elasticbench.verify.attention_job import prepare, verify_attention_one
    from elasticbench.verify.attention_matrix import AttentionCase

    # fp16 takes bf16's code path (products in the format, p and ds rounded to it); the
    # whole matrix in all three formats is `TRITON_INTERPRET=1 elasticbench verify --only
    # triton_attention --mode both` (docs/attention.md section 7)
    @pytest.mark.parametrize("dtype", ["fp32", "bf16"])
    @pytest.mark.parametrize(("generator", "shape"), [
        ("normal", (1, 2, 40, 37, 8)),  # several key and query blocks, ragged edges
        ("causal_hidden", (1, 1, 8, 8, 4)),
        ("nan_k", (1, 2, 8, 8, 4)),
        ("huge", (1, 1, 16, 16, 8)),
    ])
    @pytest.mark.parametrize("causal", [0.0, 1.0])
    @pytest.mark.parametrize("mode", ["fwd", "bwd"])
    def test_triton_attention_passes_verification(dtype, generator, shape, causal, mode):
        case = AttentionCase("elastic_attention", generator, shape, dtype,
                             (("tau", 0.5), ("beta", 1.0), ("causal", causal)), 7)
        record = verify_attention_one(get_kernel("triton_attention", mode),
                                      prepare(case, mode, None, 128))
        assert record.passed, record.reason

    def test_an_infinite_score_gives_the_mean_of_its_values():
        from elasticbench.kernels.triton.attention import attention_forward

        q = torch.zeros(1, 1, 2, 2)
        q[0, 0, 1] = torch.tensor([float("inf"), 0.0])
        k = torch.tensor([[[[1.0, 1.0], [-1.0, 1.0], [2.0, 1.0]]]])
        v = torch.arange(6.0).reshape(1, 1, 3, 2)
        out, m, _ = attention_forward(q, k, v, torch.ones(1, 1), torch.ones(1, 1), 1.0, False)
        assert m[0, 0, 1] == float("inf")
        torch.testing.assert_close(out[0, 0, 1], v[0, 0, [0, 2]].mean(0))
