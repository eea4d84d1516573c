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
    @pytest.mark.parametrize(("dtype", "causal", "arch", "padded"), [
        (torch.float32, True, 90, True), (torch.bfloat16, False, 80, False)])
    def test_triton_attention_compiles_for_the_gpus_it_is_written_for(dtype, causal, arch,
                                                                       padded):
        from elasticbench.audit.capture import capture_launches
        from elasticbench.audit.kernel_files import CompileCache, compile_one
        from elasticbench.kernels.triton.attention import attention_backward, attention_forward

        q = torch.zeros(1, 8, 1024, 64, dtype=dtype)
        heads = torch.ones(1, 8)
        stats = torch.zeros(1, 8, 1024)
        keep = (torch.arange(1024) < 700)[None] if padded else None
        with capture_launches() as launches:
            attention_forward(q, q, q, heads, heads, 0.125, causal, keep)
            attention_backward(q, q, q, q, q, stats, stats + 1, heads, heads, 0.125, causal,
                               keep)
        assert [launch.name for launch in launches] == [
            "attention_forward_kernel", "attention_dkdv_kernel", "attention_dq_kernel"]
        for launch in launches:
            compiled = compile_one(launch, arch, CompileCache(None))
            assert compiled.error is None and 0 < compiled.regs <= 255, compiled

    @pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
    @pytest.mark.parametrize("head_dim", [64, 128])
    def test_the_16_bit_kernels_take_hoppers_warpgroup_mma(head_dim):
        """On sm_90 every dot of the 16-bit kernels is a wgmma (none falls back to
        mma.sync), within the SM's shared memory; the forward and dq keep their tiles in
        registers, and so does dk/dv at head_dim 64 (at 128 it spills: the backward's
        rewrite is open, docs/attention.md section 7)."""
        from elasticbench.audit.capture import capture_launches
        from elasticbench.audit.compile import compile_launch, resource_usage
        from elasticbench.kernels.triton.attention import attention_backward, attention_forward

        q = torch.zeros(1, 2, 1024, head_dim, dtype=torch.bfloat16)
        heads = torch.ones(1, 2)
        stats = torch.zeros(1, 2, 1024)
        with capture_launches() as launches:
            attention_forward(q, q, q, heads, heads, 0.125, True)
            attention_backward(q, q, q, q, q, stats, stats + 1, heads, heads, 0.125, True)
        for launch in launches:
            compiled = compile_launch(launch, 90)
            ptx = compiled.asm["ptx"]
            regs, spills = resource_usage(compiled.asm["cubin"])
            assert "wgmma.mma_async" in ptx and "mma.sync" not in ptx, launch.name
            assert compiled.metadata.shared <= 227 * 1024, (launch.name, compiled.metadata.shared)
            if launch.name != "attention_dkdv_kernel" or head_dim <= 64:
                assert spills == 0, (launch.name, regs, spills)

else:
    from elasticbench.registry import get_kernel
    from elasticbench.verify.attention_job import prepare, verify_attention_one
    from elasticbench.verify.attention_matrix import AttentionCase

    # fp16 takes bf16's code path (products in the format, p and ds rounded to it); the
    # whole matrix in all three formats is `TRITON_INTERPRET=1 elasticbench verify --only
    # triton_attention --mode both` (docs/attention.md section 7)
    @pytest.mark.parametrize("dtype", ["fp32", "bf16"])
    @pytest.mark.parametrize(("generator", "shape"), [
        ("normal", (1, 2, 40, 37, 8)),  # several key and query blocks, ragged edges (fp32)
        ("normal", (1, 1, 80, 70, 8)),  # the same with the 16-bit formats' 64 x 64 tiles
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

    @pytest.mark.parametrize("causal", [False, True])
    def test_key_padding_matches_the_tiled_torch_code(causal):
        from elasticbench.attention import flash
        from elasticbench.kernels.triton.attention import attention_backward, attention_forward

        g = torch.Generator().manual_seed(3)
        q, k, v, do = (torch.randn(2, 2, n, 8, generator=g) for n in (40, 70, 70, 40))
        keep = torch.arange(70)[None, :] < torch.tensor([[37], [0]])  # batch 1: no key
        keep[0, 5] = False  # a hole; keys 37-69 padded (block 64-69 is not visited)
        tau, beta = torch.full((2, 2), 0.7), torch.full((2, 2), 0.4)
        got = attention_forward(q, k, v, tau, beta, 0.35, causal, keep)
        want = flash.forward(q, k, v, tau, beta, 0.35, causal, keep)
        torch.testing.assert_close(got[0], want[0], rtol=2e-5, atol=1e-6)
        assert torch.equal(got[0][1], torch.zeros_like(got[0][1]))
        grads = attention_backward(q, k, v, got[0], do, got[1], got[2], tau, beta, 0.35,
                                   causal, keep)
        wants = flash.backward(q, k, v, want[0], do, want[1], want[2], tau, beta, 0.35, causal,
                               keep)
        for name, a, b in zip(("dq", "dk", "dv", "dtau", "dbeta"), grads, wants, strict=True):
            torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5, msg=name)
        assert not grads[1][0, :, 37:].any() and not grads[2][1].any()

    def test_a_query_with_infinite_and_nan_scores_in_later_blocks():
        """+inf and NaN found in a later key block than the query's first kept score: the
        loop's running sums move to them (the +inf keys' mean; NaN over everything), with
        the backward's dv for the +inf keys, in both tile shapes."""
        from elasticbench.attention import flash
        from elasticbench.kernels.triton.attention import attention_backward, attention_forward

        g = torch.Generator().manual_seed(5)
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v, do = (torch.randn(1, 2, 150, 8, generator=g).to(dtype) for _ in range(4))
            k[0, 0, :, 0] = -1.0
            k[0, 0, 100:, 0] = 1.0  # with q's +inf first entry: +inf scores from key 100 on
            q[0, 0, 7, 0] = float("inf")
            k[0, 1, 140, :] = float("nan")  # every query of head 1 sees a NaN score
            tau, beta = torch.full((1, 2), 0.7), torch.full((1, 2), 0.4)
            out, m, den = attention_forward(q, k, v, tau, beta, 0.35, False)
            want = flash.forward(q, k, v, tau, beta, 0.35, False)
            assert m[0, 0, 7] == float("inf") and den[0, 0, 7] == 50 == want[2][0, 0, 7]
            assert out[0, 1].isnan().all() and m[0, 1].isnan().all()
            torch.testing.assert_close(out[0, 0].float(), want[0][0, 0].float(), rtol=2e-2,
                                       atol=2e-2)
            dv = attention_backward(q, k, v, out, do, m, den, tau, beta, 0.35, False)[2]
            wdv = flash.backward(q, k, v, want[0], do, want[1], want[2], tau, beta, 0.35,
                                 False)[2]
            torch.testing.assert_close(dv[0, 0].float(), wdv[0, 0].float(), rtol=2e-2,
                                       atol=2e-2)

    def test_an_infinite_score_gives_the_mean_of_its_values():
        from elasticbench.kernels.triton.attention import attention_forward

        q = torch.zeros(1, 1, 2, 2)
        q[0, 0, 1] = torch.tensor([float("inf"), 0.0])
        k = torch.tensor([[[[1.0, 1.0], [-1.0, 1.0], [2.0, 1.0]]]])
        v = torch.arange(6.0).reshape(1, 1, 3, 2)
        out, m, _ = attention_forward(q, k, v, torch.ones(1, 1), torch.ones(1, 1), 1.0, False)
        assert m[0, 0, 1] == float("inf")
        torch.testing.assert_close(out[0, 0, 1], v[0, 0, [0, 2]].mean(0))
