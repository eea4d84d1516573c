"""tau and beta read from device memory by the Triton rows kernels (kernels/triton/params.py)
and their implementation (kernels/triton/tier.py): each row computed as the scalar kernels
compute it with that row's parameters (bit for bit, forward and backward, fused and streamed
rows, tau near the edges of k's range), dtau and dbeta per row, any broadcast layout of the
parameters, and the implementation against the torch code with per-head parameters. Run under the Triton interpreter as
tests/library/test_triton.py is (one test re-runs this module with TRITON_INTERPRET=1)."""

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
        from elasticbench.harness.audit.capture import capture_launches
        from elasticbench.harness.audit.kernel_files import CompileCache, compile_one
        from elasticbench.kernels.triton.elastic_backward import elastic_backward_params
        from elasticbench.kernels.triton.exp_family import elastic_forward_params

        x = torch.zeros(4, 16, 1000)
        tau, beta = torch.ones(4, 1, 1), torch.ones(16, 1)
        with capture_launches() as launches:
            elastic_forward_params(x, tau, beta)
            elastic_backward_params(x, x, x, tau, beta)
        assert [launch.name for launch in launches] == ["exp_fused_kernel",
                                                        "elastic_bwd_fused_kernel"]
        for launch in launches:
            compiled = compile_one(launch, 90, CompileCache(None))
            assert compiled.error is None and 0 < compiled.regs <= 255, compiled

else:
    from elasticbench.kernels.triton import tier
    from elasticbench.kernels.triton.elastic_backward import (
        elastic_backward,
        elastic_backward_params,
    )
    from elasticbench.kernels.triton.exp_family import elastic_forward, elastic_forward_params
    from elasticbench.kernels.triton.launch import launch_options
    from elasticbench.kernels.triton.params import memory_params
    from elasticbench.rows.spec import ExpSpec
    from elasticbench.rows.tiers import TORCH

    DEVICE = "cuda" if devices.has_gpu() else devices.HOST
    # tau at the edges of k = log2(e)/tau's fp32 range too (k moved by a power of two)
    TAU = torch.tensor([0.5, 1.0, 3.0, 1e-33, 1.0, 1e32], dtype=torch.float32)
    BETA = torch.tensor([1.0, 0.0, 100.0, 1e-10, 2.0, 0.5], dtype=torch.float32)

    def _inputs(n: int = 40, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(6, n, generator=gen) * 2
        x[4] = -1.0  # a row that keeps nothing
        g = torch.randn(6, n, generator=gen)
        return x.to(DEVICE), g.to(DEVICE)

    # fused rows; four rows a program; rows streamed by one program; rows split in three
    PATHS = {"fused": {}, "rows": {"row_block": 4}, "online": {"max_fused": 16, "splits": 1},
             "split": {"max_fused": 16, "splits": 3}}

    @pytest.mark.parametrize("path", list(PATHS))
    def test_each_row_is_the_scalar_kernel_with_its_parameters(path) -> None:
        x, g = _inputs()
        tau, beta = TAU.to(DEVICE)[:, None], BETA.to(DEVICE)[:, None]
        with launch_options(chunk=16, **PATHS[path]):
            y = elastic_forward_params(x, tau, beta)
            dx, dtau, dbeta = elastic_backward_params(x, y, g, tau, beta)
            for r in range(6):
                t, b = TAU[r].item(), BETA[r].item()
                want = elastic_forward(x[r:r + 1], t, b)
                assert torch.equal(y[r:r + 1], want), r
                wdx, wdtau, wdbeta = elastic_backward(want, g[r:r + 1], x[r:r + 1], t, b)
                assert torch.equal(dx[r:r + 1], wdx), r
                assert dtau[r, 0] == wdtau and dbeta[r, 0] == wdbeta, r
        assert dtau[4] == 0 and dbeta[4] == 0 and not dx[4].any()

    def test_zero_dimensional_parameters_are_summed_on_the_device() -> None:
        x, g = _inputs()
        tau, beta = torch.tensor(0.7, device=DEVICE), torch.tensor(0.3, device=DEVICE)
        y = elastic_forward_params(x, tau, beta)
        assert torch.equal(y, elastic_forward(x, 0.7, 0.3))
        dx, dtau, dbeta = elastic_backward_params(x, y, g, tau, beta)
        wdx, wdtau, wdbeta = elastic_backward(y, g, x, 0.7, 0.3)
        assert dtau.shape == dbeta.shape == (1,)
        assert torch.equal(dx, wdx) and dtau[0] == wdtau and dbeta[0] == wdbeta

    @pytest.mark.parametrize(("tau_shape", "beta_shape"), [
        ((3, 1, 1), (2, 1, 1, 1)),  # per head of (2, 3, 5, n) and per batch
        ((2, 3, 1, 1), (5, 1)),  # per (batch, head), and per query
        ((2, 3, 5, 1), (2, 3, 5, 1)),  # per row
    ])
    def test_each_layout_finds_each_rows_values(tau_shape, beta_shape) -> None:
        """memory_params's (size, stride) dims locate every row's pair: the kernels read the
        values the broadcast puts there, as the materialized per-row copy says."""
        gen = torch.Generator().manual_seed(2)
        x = torch.randn(2, 3, 5, 12, generator=gen).to(DEVICE)
        tau = (torch.rand(tau_shape, generator=gen) + 0.25).to(DEVICE)
        beta = torch.rand(beta_shape, generator=gen).to(DEVICE)
        params = memory_params(x, tau, beta)
        d1, d2, ts0, ts1, ts2, bs0, bs1, bs2 = params.args[7:]
        assert params.from_memory
        per_row_tau = tau.expand(2, 3, 5, 1).reshape(-1)
        per_row_beta = beta.expand(2, 3, 5, 1).reshape(-1)
        for row in range(30):
            i2, i1, i0 = row % d2, (row // d2) % d1, row // (d1 * d2)
            t_view, b_view = params.args[5], params.args[6]
            got_t = t_view.reshape(-1)[0] if t_view.ndim == 0 else \
                t_view.as_strided((1,), (1,), t_view.storage_offset() + i0 * ts0 + i1 * ts1
                                  + i2 * ts2)[0]
            got_b = b_view.reshape(-1)[0] if b_view.ndim == 0 else \
                b_view.as_strided((1,), (1,), b_view.storage_offset() + i0 * bs0 + i1 * bs1
                                  + i2 * bs2)[0]
            assert got_t == per_row_tau[row] and got_b == per_row_beta[row], row
        y = elastic_forward_params(x, tau, beta)
        want = elastic_forward_params(x, per_row_tau.reshape(2, 3, 5, 1),
                                      per_row_beta.reshape(2, 3, 5, 1))
        assert torch.equal(y, want)

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
