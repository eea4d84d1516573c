"""Per-row tau and beta on the Triton rows kernels and their tier (kernels/triton/tier.py):
each row computed as the scalar kernels compute it with that row's parameters (bit for
bit, forward and backward, fused and streamed rows), dtau and dbeta per row, and the tier
against the torch code with per-head parameters. Run under the Triton interpreter as
tests/test_triton.py is (one test re-runs this module with TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from elasticbench import devices

pytestmark = pytest.mark.needs("triton")

if not devices.triton_interpreted() and not devices.has_gpu():

    def test_per_row_parameters_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__)

    @pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
    def test_the_per_row_kernels_compile_for_sm_90() -> None:
        from elasticbench.audit.capture import capture_launches
        from elasticbench.audit.kernel_files import CompileCache, compile_one
        from elasticbench.kernels.triton.elastic_backward import elastic_backward_rows
        from elasticbench.kernels.triton.exp_family import (
            elastic_forward_rows,
            row_param_table,
        )

        x = torch.zeros(64, 1000)
        table = row_param_table(torch.ones(64), torch.ones(64))
        with capture_launches() as launches:
            elastic_forward_rows(x, table)
            elastic_backward_rows(x, x, x, table)
        assert [launch.name for launch in launches] == ["exp_fused_kernel",
                                                        "elastic_bwd_fused_kernel"]
        for launch in launches:
            compiled = compile_one(launch, 90, CompileCache(None))
            assert compiled.error is None and 0 < compiled.regs <= 255, compiled

else:
    from elasticbench.kernels.triton import tier
    from elasticbench.kernels.triton.elastic_backward import (
        elastic_backward,
        elastic_backward_rows,
    )
    from elasticbench.kernels.triton.exp_family import (
        elastic_forward,
        elastic_forward_rows,
        row_param_table,
    )
    from elasticbench.kernels.triton.launch import launch_options
    from elasticbench.rows.tiers import TORCH, ExpSpec

    DEVICE = "cuda" if devices.has_gpu() else devices.HOST
    TAU = torch.tensor([0.5, 1.0, 3.0, 0.05, 1.0, 7.0], dtype=torch.float64)
    BETA = torch.tensor([1.0, 0.0, 100.0, 1e-10, 2.0, 0.5], dtype=torch.float64)

    def _inputs(n: int = 40, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(6, n, generator=gen) * 2
        x[4] = -1.0  # a row that keeps nothing
        g = torch.randn(6, n, generator=gen)
        return x.to(DEVICE), g.to(DEVICE)

    @pytest.mark.parametrize("max_fused", [16384, 16])  # fused rows, then streamed ones
    def test_each_row_is_the_scalar_kernel_with_its_parameters(max_fused) -> None:
        x, g = _inputs()
        table = row_param_table(TAU.to(DEVICE), BETA.to(DEVICE))
        with launch_options(max_fused=max_fused, chunk=16):
            y = elastic_forward_rows(x, table)
            dx, dtau, dbeta = elastic_backward_rows(y, g, x, table)
            for r in range(6):
                t, b = TAU[r].item(), BETA[r].item()
                want = elastic_forward(x[r:r + 1], t, b)
                assert torch.equal(y[r:r + 1], want), r
                wdx, wdtau, wdbeta = elastic_backward(want, g[r:r + 1], x[r:r + 1], t, b)
                assert torch.equal(dx[r:r + 1], wdx), r
                assert dtau[r] == wdtau and dbeta[r] == wdbeta, r
        assert dtau[4] == 0 and dbeta[4] == 0 and not dx[4].any()

    def test_parameters_outside_the_kernels_domain_have_no_table() -> None:
        """(tier.accepts then declines, and the torch code serves)"""
        assert row_param_table(torch.tensor([1.0, -1.0]), torch.ones(2)) is None
        assert row_param_table(torch.tensor([1e-40, 1.0]), torch.ones(2)) is None
        assert row_param_table(torch.ones(2), torch.tensor([0.0, -1.0])) is None

    def test_the_tier_with_per_head_parameters_matches_the_torch_code() -> None:
        gen = torch.Generator().manual_seed(1)
        x = (torch.randn(2, 3, 5, 24, generator=gen) * 2).to(DEVICE)
        g = torch.randn(2, 3, 5, 24, generator=gen).to(DEVICE)
        tau = torch.tensor([0.5, 1.5, 4.0], device=DEVICE).reshape(3, 1, 1)
        beta = torch.tensor([0.0, 1.0, 10.0], device=DEVICE).reshape(3, 1, 1)
        spec = ExpSpec(mask_negative=True, tau=tau, offset=beta)
        y = tier.forward(x, spec)
        torch.testing.assert_close(y, TORCH.forward(x, spec), rtol=2e-6, atol=1e-7)
        dx, dtau, dbeta = tier.backward(x, y, g, spec, True)
        rdx, rdtau, rdbeta = TORCH.backward(x, y, g, spec, True)
        assert dtau.shape == (2, 3, 5, 1) and dbeta.shape == (2, 3, 5, 1)
        torch.testing.assert_close(dx, rdx, rtol=1e-5, atol=1e-6)
        for got, want in ((dtau, rdtau), (dbeta, rdbeta)):
            torch.testing.assert_close(got.sum((0, 2)).double(),
                                       want.expand_as(got).sum((0, 2)).double(),
                                       rtol=1e-5, atol=1e-6)
        assert tier.backward(x, y, g, spec, False)[1:] == (None, None)
