"""The Triton attention kernel: verified under the interpreter against the exact reference,
and compiled for sm_90 and sm_80 without a GPU (docs/attention.md sections 5 and 7).

As in tests/library/test_triton.py, the interpreter must be on before `triton.jit` decorates the
kernel, so in an ordinary run one test re-runs this module with TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from elasticbench import devices, settings

pytestmark = pytest.mark.needs("triton")


if not devices.triton_interpreted():

    @pytest.mark.ci  # 40-70 s of a core: make test kept under 5 minutes on 2 cores
    def test_triton_attention_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__)

    @pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
    @pytest.mark.parametrize(("dtype", "causal", "arch", "padded"), [
        (torch.float32, True, 90, True), (torch.bfloat16, False, 80, False)])
    def test_triton_attention_compiles_for_the_gpus_it_is_written_for(dtype, causal, arch,
                                                                       padded):
        from elasticbench.harness.audit.capture import capture_launches
        from elasticbench.harness.audit.kernel_files import CompileCache, compile_one
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        q = torch.zeros(1, 8, 1024, 64, dtype=dtype)
        heads = torch.ones(1, 8)
        stats = torch.zeros(1, 8, 1024)
        keep = (torch.arange(1024) < 700)[None] if padded else None
        with capture_launches() as launches:
            attention_forward(q, q, q, heads, heads, 0.125, causal, keep)
            attention_backward(q, q, q, q, q, stats, stats + 1, heads, heads, 0.125, causal,
                               keep)
        assert [launch.name for launch in launches] == [
            "attention_forward_kernel", "attention_prepare_kernel", "attention_dkdv_kernel",
            "attention_dq_kernel"]
        for launch in launches:
            compiled = compile_one(launch, arch, CompileCache(None))
            assert compiled.error is None and 0 < compiled.regs <= 255, compiled
            # the lists are Hopper's: on sm_80 the 16-bit dq at 64 x 64 spills 40 B a thread
            assert arch != 90 or compiled.spill_bytes == 0, compiled

    @pytest.mark.ci
    @pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
    @pytest.mark.parametrize("causal", [False, True])
    def test_key_padding_takes_the_dkdv_configurations_that_do_not_spill_with_it(causal):
        """A key-padding mask's flags keep more values live: the pointer dk/dv 128x32 w8
        tiles at head dim 128 spilled with it (8-24 B per thread); what a padded call is
        offered (128x16 w8 s2, the list at 128 now), compiled with padding (bf16; fp16
        alike), does not."""
        from elasticbench.harness.audit.attention_tiles import compile_report
        from elasticbench.kernels.triton import attention_configs as ac

        padded = ac.configs("dkdv", 128, torch.bfloat16, causal, padded=True)
        plain = ac.configs("dkdv", 128, torch.bfloat16, causal)
        assert padded and set(padded) <= set(plain)
        assert ac.offered("dkdv", 128, torch.bfloat16, causal, padded=True) == padded
        bad = [f"{t}: {', '.join(r.problems())}" for t in padded
               if (r := compile_report("dkdv", 128, torch.bfloat16, causal, t,
                                       padded=True)).problems()]
        assert not bad, bad

    # (dk/dv at 128 has no TMA configuration: every one spills with Triton 3.6.0)
    _TMA_AUDIT = [("fwd", 64), ("fwd", 128), ("dkdv", 64), ("dq", 64), ("dq", 128)]

    @pytest.mark.ci
    @pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
    @pytest.mark.parametrize(("kernel", "head_dim"), _TMA_AUDIT)
    def test_the_tma_configurations_take_tma_and_wgmma_and_do_not_spill(kernel, head_dim):
        """The TMA configurations (tensor descriptors) on sm_90a: the TMA bulk copies in the
        PTX, every dot wgmma, within 227 KiB, no spills; the pointer configurations' audit
        above fails any that uses TMA unasked. A representative subset, 12 compiles (about
        25 s of a core): of each list the first configuration in bf16, causal with key
        padding (the most live values: the padded keys' zeroing), and the smallest in fp16,
        not causal. Every TMA configuration of every list (bf16 and fp16, causal or not,
        key padding or not; the other weights at head dim 128 without) passed the same
        checks when the lists were made (docs/attention.md section 7)."""
        from elasticbench.harness.audit.attention_tiles import compile_report
        from elasticbench.kernels.triton import attention_configs as ac

        if not ac.tma_available():
            pytest.skip("this Triton has no tensor descriptors")
        bf16 = ac.configs(kernel, head_dim, torch.bfloat16, True, tma=True)
        fp16 = ac.configs(kernel, head_dim, torch.float16, False, tma=True)
        assert ac.configs(kernel, head_dim, torch.float32, True, tma=True) == ()
        runs = [(bf16[0], torch.bfloat16, True, True), (ac.smallest(fp16), torch.float16,
                                                        False, False)]
        for tiles, dtype, causal, padded in runs:
            assert tiles.tma
            report = compile_report(kernel, head_dim, dtype, causal, tiles, padded=padded)
            assert report.tma and not report.problems(), report

    def test_tma_configurations_are_offered_by_feature_and_never_forced_on_a_call():
        """TMA configurations exist where this Triton has tensor descriptors; a call whose rows
        are not 16-byte aligned runs even a forced TMA configuration with pointer loads;
        $ELASTICBENCH_TRITON_ATTENTION_TMA keeps one kind; the launch note names TMA."""
        from dataclasses import replace
        from unittest import mock

        from elasticbench.harness.audit.capture import capture_launches
        from elasticbench.kernels.triton import attention_configs as ac
        from elasticbench.kernels.triton.flash_attention import attention_forward

        tma = ac.configs("fwd", 128, torch.bfloat16, False, tma=True)
        assert tma and all(t.tma for t in tma) and str(tma[0]).endswith(" tma")
        assert not any(t.tma for t in ac.configs("fwd", 128, torch.bfloat16, False))
        with mock.patch.object(ac, "tma_available", lambda: False):
            assert ac.configs("dq", 64, torch.bfloat16, True, tma=True) == ()
            assert ac.offered("dq", 64, torch.bfloat16, True, tma=True) == ac.configs(
                "dq", 64, torch.bfloat16, True)
        plain = ac.configs("dkdv", 64, torch.bfloat16, True)
        with settings.overriding(triton_attention_tma=None):
            both = ac.offered("dkdv", 64, torch.bfloat16, True, tma=True)
        assert both == plain + ac.configs("dkdv", 64, torch.bfloat16, True, tma=True)
        assert ac.smallest(both) == ac.smallest(plain)  # the interpreter: pointer loads
        for mode, want in (("1", both[len(plain):]), ("0", plain), ("", both)):
            with settings.overriding(triton_attention_tma=settings.parse(ac.TMA_ENV, mode)):
                assert ac.offered("dkdv", 64, torch.bfloat16, True, tma=True) == want
                assert ac.offered("dkdv", 64, torch.bfloat16, True) == plain  # not offered
        with settings.overriding(triton_attention_tma="1"):  # fp32: for verification
            fp32 = ac.offered("fwd", 64, torch.float32, False, tma=True)
            assert [replace(t, tma=False) for t in fp32] == list(ac.configs(
                "fwd", 64, torch.float32, False)) and all(t.tma for t in fp32)
        heads = torch.ones(1, 2)
        for d, dtype, allowed in ((4, torch.bfloat16, False), (8, torch.bfloat16, True),
                                  (4, torch.float32, True), (6, torch.float32, False)):
            q = torch.zeros(1, 2, 40, d, dtype=dtype)
            shifted = torch.zeros(q.numel() + 1, dtype=dtype)[1:].view(q.shape)  # base % 16
            with capture_launches() as launches:
                attention_forward(q, q, q, heads, heads, 0.5, False, tile=tma[0])
                attention_forward(q, shifted, q, heads, heads, 0.5, False, tile=tma[0])
            assert [la.kwargs["TMA"] for la in launches] == [allowed, False], (d, dtype)

    @pytest.mark.ci  # a dozen compiles: the command end to end, not the audit itself
    @pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
    def test_the_audit_command_passes_on_a_selection(cli, tmp_path):
        """`elasticbench audit --attention` over what an fp32 softmax1 call at head dim 64 can
        launch (causal or not, key padding or not) on this Triton: exit 0, and its JSON has a
        report per configuration with no problem. The whole audit (every dtype and weight) is
        the command itself, run apart (docs/attention.md section 7)."""
        import json

        from elasticbench.harness.audit.attention_tiles import launchable

        out = tmp_path / "audit.json"
        r = cli("audit", "--attention", "-d", "fp32", "--weights", "softmax1",
                "--head-dims", "64", "--json", str(out))
        assert r.code == 0, r.out + r.err
        data = json.loads(out.read_text())
        want = list(launchable(("fp32",), ("softmax1",), (64,)))
        assert data["configurations"] == len(want) == len(data["reports"]) >= 6
        assert data["failing"] == 0 and not any(rep["problems"] for rep in data["reports"])
        assert {rep["tiles"] for rep in data["reports"]} == {str(i.tiles) for i in want}
        assert "none spills" in r.out

    def test_a_configuration_that_spills_for_a_weight_is_off_its_list_alone():
        from elasticbench.attention.weights import Weight
        from elasticbench.kernels.triton import attention_configs as ac

        assert ac._SPILLS_FOR
        for kernel, cls, causal, weight, tiles in ac._SPILLS_FOR:
            for dtype in (torch.bfloat16, torch.float16):
                assert tiles not in ac.configs(kernel, cls, dtype, causal, weight)
                assert tiles in ac.configs(kernel, cls, dtype, causal, Weight.ELASTIC)

else:
    from elasticbench.harness.kinds.attention.verify_job import prepare, verify_attention_one
    from elasticbench.harness.kinds.attention.verify_matrix import AttentionCase
    from elasticbench.harness.registry import get_kernel

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
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

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
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

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

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_tensor_descriptors_give_the_pointer_loads_values_bit_for_bit(dtype):
        """The TMA form (q, k, v, dO through tensor descriptors, out, dq, dk, dv stored
        through them) of the interpreter's tiles against their pointer loads: out, m, den and the
        five gradients bit-identical, with an odd key length (ragged last key block), key
        padding whose padded keys hold NaN and inf (a descriptor reads them: they must
        meet no zero weight), causal, in Elastic and symax."""
        from dataclasses import replace

        from elasticbench.attention.weights import Weight
        from elasticbench.kernels.triton import attention_configs as ac
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        if not ac.tma_available():
            pytest.skip("this Triton has no tensor descriptors")
        g = torch.Generator().manual_seed(8)
        q, do = (torch.randn(2, 1, 70, 16, generator=g).to(dtype) for _ in range(2))
        k, v = (torch.randn(2, 1, 77, 16, generator=g).to(dtype) for _ in range(2))
        mask = torch.arange(77)[None, :] < torch.tensor([[77], [56]])
        mask[1, 3] = False
        for t in (k, v):
            t[1, :, 3] = float("nan")
            t[1, :, 60] = float("inf")
        tau, beta = torch.tensor([[0.3], [1.7]]), torch.tensor([[2.0], [0.5]])
        cases = [(Weight.ELASTIC, True, mask), (Weight.ELASTIC, False, None)]
        if dtype == torch.float32:
            cases.append((Weight.SYMAX, True, mask))
        for weight, causal, keep in cases:
            # the interpreter's tiles (fp32 has no TMA list: its tiles forced to TMA)
            tiles = [ac.smallest(ac.configs(kernel, 16, dtype, causal, weight))
                     for kernel in ac.KERNELS]
            results = []
            for tma in (False, True):
                fwd, kv, dq = (replace(t, tma=tma) for t in tiles)
                out = attention_forward(q, k, v, tau, beta, 0.3, causal, keep, weight, fwd)
                grads = attention_backward(q, k, v, out[0], do, out[1], out[2], tau, beta, 0.3,
                                           causal, keep, weight, (kv, dq))
                results.append([*out, *grads])
            names = ("out", "m", "den", "dq", "dk", "dv", "dp_score", "dp_den")
            for name, a, b in zip(names, *results, strict=True):
                assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (
                    weight.name, causal, name)
            # (unpadded, batch 1's NaN keys are seen: NaN as in both paths)
            assert keep is None or results[0][0].isfinite().all(), "padded keys seen"

    def test_an_infinite_score_gives_the_mean_of_its_values():
        from elasticbench.kernels.triton.flash_attention import attention_forward

        q = torch.zeros(1, 1, 2, 2)
        q[0, 0, 1] = torch.tensor([float("inf"), 0.0])
        k = torch.tensor([[[[1.0, 1.0], [-1.0, 1.0], [2.0, 1.0]]]])
        v = torch.arange(6.0).reshape(1, 1, 3, 2)
        out, m, _ = attention_forward(q, k, v, torch.ones(1, 1), torch.ones(1, 1), 1.0, False)
        assert m[0, 0, 1] == float("inf")
        torch.testing.assert_close(out[0, 0, 1], v[0, 0, [0, 2]].mean(0))

    @pytest.mark.parametrize(("dtype", "lq", "lk", "causal", "masked"), [
        (torch.float32, 150, 130, True, True), (torch.float32, 70, 150, True, False),
        (torch.bfloat16, 150, 130, True, True)])
    def test_per_head_parameters_and_every_loop_match_the_tiled_torch_code(dtype, lq, lk,
                                                                           causal, masked):
        """tau and beta per (batch, head); the unmasked blocks, the causal diagonal, the
        ragged ends of both lengths and key padding, forward and the five gradients (bf16
        against fp32 torch: within a few of its roundings of the largest element)."""
        from elasticbench.attention import flash
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        g = torch.Generator().manual_seed(11)
        q, do = (torch.randn(2, 2, lq, 16, generator=g).to(dtype) for _ in range(2))
        k, v = (torch.randn(2, 2, lk, 16, generator=g).to(dtype) for _ in range(2))
        tau = torch.tensor([[0.3, 0.9], [1.7, 0.6]])
        beta = torch.tensor([[0.0, 2.0], [0.5, 1.0]])
        mask = None
        if masked:
            mask = torch.arange(lk)[None, :] < torch.tensor([[lk], [lk - 21]])
            mask[1, 3] = False
        rel = 2e-5 if dtype == torch.float32 else 2e-2
        got = attention_forward(q, k, v, tau, beta, 0.3, causal, mask)
        want = flash.forward(q.float(), k.float(), v.float(), tau, beta, 0.3, causal, mask)
        grads = attention_backward(q, k, v, got[0], do, got[1], got[2], tau, beta, 0.3, causal,
                                   mask)
        wants = flash.backward(q.float(), k.float(), v.float(), want[0], do.float(), want[1],
                               want[2], tau, beta, 0.3, causal, mask)
        for name, a, b in zip(("out", "m", "den", "dq", "dk", "dv", "dtau", "dbeta"),
                              (*got, *grads), (*want, *wants), strict=True):
            err = float((a.float() - b).abs().max())
            assert err <= rel * float(b.abs().max()), (name, err, float(b.abs().max()))

    def test_a_maximum_whose_exponent_overflows_is_one_hot_like_an_infinite_one():
        """tau so small that m log2(e)/tau overflows fp32 at every query (scores >= 2.8):
        the weights are 1/count on the maximum and 0 elsewhere (the fix-up pass of saturated
        queries), den the count, dv dO/count at the maximum."""
        from elasticbench.attention import flash
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        g = torch.Generator().manual_seed(2)
        q, k = (torch.randn(1, 1, 20, 8, generator=g).abs() + 1 for _ in range(2))
        v, do = (torch.randn(1, 1, 20, 8, generator=g) for _ in range(2))
        tau, beta = torch.full((1, 1), 1e-38), torch.full((1, 1), 0.5)
        out, m, den = attention_forward(q, k, v, tau, beta, 0.35, False)
        want = flash.forward(q, k, v, tau, beta, 0.35, False)
        assert torch.equal(den, torch.ones_like(den))
        torch.testing.assert_close(out, want[0])
        dv = attention_backward(q, k, v, out, do, m, den, tau, beta, 0.35, False)[2]
        torch.testing.assert_close(dv, flash.backward(q, k, v, want[0], do, want[1], want[2],
                                                      tau, beta, 0.35, False)[2])

    def test_the_weight_and_the_scale_it_cannot_compute_are_refused():
        from elasticbench.attention.weights import Weight
        from elasticbench.kernels.triton.flash_attention import WEIGHTS, attention_forward

        q = torch.zeros(1, 1, 4, 4)
        p = torch.ones(1, 1)
        assert set(Weight) == set(WEIGHTS)
        with pytest.raises(ValueError, match="not a valid Weight"):
            attention_forward(q, q, q, p, p, 0.5, False, None, 9)
        for scale in (0.0, -0.5, float("nan")):
            with pytest.raises(ValueError, match="positive finite scale"):
                attention_forward(q, q, q, p, p, scale, False)

    def test_the_interpreter_runs_the_smallest_configuration_of_each_list():
        from elasticbench.kernels.triton import attention_configs as ac

        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for kernel in ac.KERNELS:
                options = ac.configs(kernel, 64, dtype, True)
                q = torch.zeros(1, 1, 4, 64, dtype=dtype)
                chosen = ac.choose(kernel, 64, q, True, False, lambda t: 1 / 0)
                assert chosen == ac.smallest(options) and chosen in options

    @pytest.mark.parametrize(("causal", "masked"), [(False, False), (True, True)])
    def test_softmax1_matches_a_torch_composite_in_fp32(causal, masked):
        """Weight.SOFTMAX1: exp(s) / (1 + sum exp(s)) over every visible score (negative ones
        too), forward and dq, dk, dv against autograd of the plain composite; its p_score and p_den
        are ignored and their gradients are 0."""
        import math

        from elasticbench.attention.weights import Weight
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        g = torch.Generator().manual_seed(4)
        q, do = (torch.randn(2, 2, 70, 16, generator=g) for _ in range(2))
        k, v = (torch.randn(2, 2, 90, 16, generator=g) for _ in range(2))
        q[0, 0] *= 6  # large scores: the running shift matters
        mask = None
        if masked:
            mask = torch.arange(90)[None, :] < torch.tensor([[90], [50]])
            mask[1, 3] = False
        ignored = torch.full((2, 2), 7.0)
        out, m, den = attention_forward(q, k, v, ignored, ignored, 0.3, causal, mask,
                                        Weight.SOFTMAX1)
        grads = attention_backward(q, k, v, out, do, m, den, ignored, ignored, 0.3, causal,
                                   mask, Weight.SOFTMAX1)
        qq, kk, vv = (t.double().requires_grad_() for t in (q, k, v))
        s = qq @ kk.transpose(-1, -2) * 0.3
        hidden = torch.zeros(s.shape, dtype=torch.bool)
        if causal:
            hidden |= torch.arange(90)[None, :] > torch.arange(70)[:, None]
        if mask is not None:
            hidden |= ~mask[:, None, None, :]
        s = s.masked_fill(hidden, -math.inf)
        shift = s.amax(-1, keepdim=True).clamp_min(0)
        e = torch.exp(s - shift)
        want = (e / (torch.exp(-shift) + e.sum(-1, keepdim=True))) @ vv
        wants = torch.autograd.grad(want, (qq, kk, vv), do.double())
        torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-6)
        for name, a, b in zip(("dq", "dk", "dv"), grads[:3], wants, strict=True):
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5, msg=name)
        assert not grads[3].any() and not grads[4].any()

    _SUMS = ("SYMAX", "STABLEMAX", "SIGMOID")

    @pytest.mark.parametrize("weight", _SUMS)
    @pytest.mark.parametrize(("causal", "masked"), [(False, False), (True, True)])
    def test_the_sums_weights_match_the_composite_in_fp32(weight, causal, masked):
        """symax, stablemax and sigmoid: forward, dq, dk, dv and the row parameters' grads
        (d eta, d bias; the unused one 0) against autograd of attention_composite in fp64,
        with causal and key padding, across masked and unmasked key blocks."""
        from elasticbench.attention.composite import attention_composite
        from elasticbench.attention.weights import Weight
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        w = Weight[weight]
        g = torch.Generator().manual_seed(6)
        q, do = (torch.randn(2, 2, 40, 16, generator=g) for _ in range(2))
        k, v = (torch.randn(2, 2, 50, 16, generator=g) for _ in range(2))
        p_score, p_den = torch.randn(2, 2, generator=g), torch.rand(2, 2, generator=g) + 0.5
        mask = None
        if masked:
            mask = torch.arange(50)[None, :] < torch.tensor([[50], [35]])
            mask[1, 3] = False
        out, m, den = attention_forward(q, k, v, p_score, p_den, 0.3, causal, mask, w)
        grads = attention_backward(q, k, v, out, do, m, den, p_score, p_den, 0.3, causal, mask, w)
        qq, kk, vv, a, b = (t.double().requires_grad_() for t in (q, k, v, p_score, p_den))
        want = attention_composite(w, qq, kk, vv, p_score=a[..., None, None],
                                   p_den=b[..., None, None], scale=0.3, causal=causal,
                                   attn_mask=None if mask is None else mask[:, None, None, :])
        wants = torch.autograd.grad(want, (qq, kk, vv, a, b), do.double(), allow_unused=True)
        torch.testing.assert_close(out.double(), want.detach(), rtol=1e-5, atol=1e-5)
        for name, x, y in zip(("dq", "dk", "dv", "dp_score", "dp_den"), grads, wants, strict=True):
            y = torch.zeros_like(x.double()) if y is None else y
            torch.testing.assert_close(x.double(), y, rtol=1e-4, atol=1e-5, msg=name)
        used = {Weight.SYMAX: 4, Weight.SIGMOID: 3}.get(w)
        assert all(not grads[i].any() for i in (3, 4) if i != used)
        if used is not None:
            assert grads[used].abs().min() > 0
        if masked:  # padded keys get nothing
            assert not grads[1][1, :, 35:].any() and not grads[2][1, :, 3].any()

    @pytest.mark.parametrize("weight", _SUMS)
    def test_the_sums_weights_special_values_follow_the_tiled_torch_code(weight):
        """Head 0: +inf scores from key 30 on for query 7 (and -inf on keys before: infinite
        weights for symax), a query with no visible key (key padding hides every key of
        batch 1's query 1, causally), head 1 a NaN key at 45: out, m, den and dv as flash's
        (the normalized queries NaN; sigmoid's NaN only in the NaN key's products, +inf
        scores weigh 1, -inf 0)."""
        from elasticbench.attention import flash
        from elasticbench.attention.weights import Weight
        from elasticbench.kernels.triton.flash_attention import (
            attention_backward,
            attention_forward,
        )

        w = Weight[weight]
        g = torch.Generator().manual_seed(7)
        q, do = (torch.randn(2, 2, 40, 8, generator=g) for _ in range(2))
        k, v = (torch.randn(2, 2, 50, 8, generator=g) for _ in range(2))
        k[0, 0, :, 0] = -1.0
        k[0, 0, 30:, 0] = 1.0
        q[0, 0, 7, 0] = float("inf")
        k[:, 1, 45] = float("nan")
        mask = torch.ones(2, 50, dtype=torch.bool)
        mask[1, :2] = False  # batch 1, causally: queries 0 and 1 see no key
        p_score, p_den = torch.full((2, 2), 0.3), torch.full((2, 2), 0.6)
        got = attention_forward(q, k, v, p_score, p_den, 0.35, False, mask, w)
        want = flash.forward(q, k, v, p_score, p_den, 0.35, False, mask, w)
        for name, x, y in zip(("out", "m", "den"), got, want, strict=True):
            torch.testing.assert_close(x, y.float(), rtol=1e-5, atol=1e-5, equal_nan=True,
                                       msg=name)
        got_c = attention_forward(q, k, v, p_score, p_den, 0.35, True, mask, w)
        assert not got_c[0][1, :, :2].any()
        if w.normalized:
            hits = 50 if w is Weight.SYMAX else 20
            assert got[1][0, 0, 7] == float("inf") and got[2][0, 0, 7] == hits
            assert got[0][:, 1, :40].isnan().all()
        else:  # one NaN key: NaN everywhere in out, as its value's product is
            assert got[0][:, 1].isnan().all() and not got[1].any() and (got[2] == 1).all()
            v2 = v.clone()
            k2 = k.clone()
            k2[:, 1, 45] = 0.0
            ok = attention_forward(q, k2, v2, p_score, p_den, 0.35, False, mask, w)[0]
            assert ok[:, 1].isfinite().all()
        dv = attention_backward(q, k, v, got[0], do, got[1], got[2], p_score, p_den, 0.35, False,
                                mask, w)[2]
        wdv = flash.backward(q, k, v, want[0], do, want[1], want[2], p_score, p_den, 0.35, False,
                             mask, w)[2]
        torch.testing.assert_close(dv[:, 0], wdv[:, 0].float(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(dv, wdv.float(), rtol=1e-4, atol=1e-5, equal_nan=True)

    def test_a_stablemax_or_symax_sum_that_overflows_is_refused_as_nan():
        """Finite scores whose st(s) or |s| sum past fp32's largest: NaN, not a mean."""
        from elasticbench.attention.weights import Weight
        from elasticbench.kernels.triton.flash_attention import attention_forward

        q = torch.full((1, 1, 1, 1), 3.0e38)
        k = torch.full((1, 1, 4, 1), 1.0)
        k[0, 0, 1] = -1.0
        v = torch.ones(1, 1, 4, 1)
        one = torch.ones(1, 1)
        for w in (Weight.STABLEMAX, Weight.SYMAX):
            out, _, den = attention_forward(q, k, v, one, one, 1.0, False, None, w)
            assert out.isnan().all() and den.isnan().all()

    def test_fp16_symax_and_stablemax_weights_past_fp16s_largest_stay_finite():
        """|s| and st(s) above 65504 are not fp16 numbers: the forward scales them by the
        running power of two of the largest before p v (out as the tiled torch code's)."""
        from elasticbench.attention import flash
        from elasticbench.attention.weights import Weight
        from elasticbench.kernels.triton.flash_attention import attention_forward

        g = torch.Generator().manual_seed(3)
        q = (torch.randn(1, 2, 40, 16, generator=g) * 150).half()
        k = (torch.randn(1, 2, 50, 16, generator=g) * 150).half()
        v = torch.randn(1, 2, 50, 16, generator=g).half()
        q[0, 1] /= 1000  # head 1: small weights, no rescale
        assert (q[0, 0].float() @ k[0, 0].float().T).abs().max() * 0.25 > 65504
        p = torch.full((1, 2), 0.5)
        for w in (Weight.SYMAX, Weight.STABLEMAX):
            out, _, den = attention_forward(q, k, v, p, p, 0.25, True, None, w)
            want = flash.forward(q, k, v, p, p, 0.25, True, None, w)
            torch.testing.assert_close(out, want[0], rtol=2e-3, atol=2e-3)
            torch.testing.assert_close(den, want[2].float(), rtol=1e-5, atol=0)
