"""The resident path of the Triton row kernels (kernels/triton/launch.py, plan_rows): a long
row split over programs that each hold their block in registers across the row's combine,
forward for every family and the Elastic-Softmax backward.

Its programs wait for each other, so under the interpreter it runs with
elasticbench.triton_interpreter.cooperative_grid (all programs at once, in threads): what is
checked is the kernels' own barrier. The resident path computes each block's partials as the
split path computes a split of one chunk, so against that split it must give the same bits,
special rows included. As test_triton.py, an ordinary run re-runs this module in a
subprocess with TRITON_INTERPRET=1 (about 20 s of interpreter: CI's ci step).
"""

from __future__ import annotations

import math

import pytest
import torch

from elasticbench import devices

if devices.triton_unavailable() is not None:  # neither a GPU nor the interpreter here

    @pytest.mark.ci
    def test_resident_path_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__, timeout=900)

else:
    import triton
    import triton.language as tl

    from elasticbench.kernels.triton import launch
    from elasticbench.kernels.triton.elastic_backward import elastic_backward_params
    from elasticbench.kernels.triton.exp_family import elastic_forward, exp_normalize
    from elasticbench.kernels.triton.launch import PLANS, launch_options
    from elasticbench.kernels.triton.row_parts import arrive_and_wait
    from elasticbench.kernels.triton.weight_family import stablemax_forward, symax_forward

    pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
    DEVICE = "cuda" if devices.has_gpu() else devices.HOST
    NAN, INF = math.nan, math.inf

    FORWARD = {
        "elastic": lambda x: elastic_forward(x, 0.7, 0.5),
        "softmax": lambda x: exp_normalize(x, tau=1.0, beta=0.0, nonneg=False, floor0=False,
                                           offset=False),
        "softmax1": lambda x: exp_normalize(x, tau=1.0, beta=1.0, nonneg=False, floor0=True,
                                            offset=True),
        "stablemax": stablemax_forward,
        "symax": lambda x: symax_forward(x, 0.5),
    }

    def _rows(rows: int, n: int, seed: int) -> torch.Tensor:
        """Ordinary rows with the special ones among them: a NaN, two +inf in different
        blocks, nothing kept by elastic, -inf throughout, zeros, the max in one block."""
        x = torch.randn(rows, n, generator=torch.Generator().manual_seed(seed)) * 3
        x[1, 7] = NAN
        x[2, [1, n - 2]] = INF
        x[3] = -1.0
        x[4] = -INF
        if rows > 5:
            x[5] = 0.0
            x[6 % rows, : n // 2] = -5.0  # the max in the last blocks only
        return x

    def _bits(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)

    def _plan() -> str:
        return list(PLANS.values())[-1].describe()

    # 16-wide blocks on the interpreter's 4 "SMs" (8 programs resident): 50 columns are 4
    # blocks, the last ragged, 2 rows a wave, 9 rows 5 waves; 64 are 4 even blocks; 33 are 3
    # (2 rows a wave, the last program idle); the ragged one in both dtypes, each other
    # once (the dtype changes the loads and stores, not the blocks' geometry)
    SHAPES = [(9, 50, torch.float32), (9, 50, torch.bfloat16), (5, 64, torch.float32),
              (7, 33, torch.bfloat16)]

    @pytest.mark.parametrize(("rows", "n", "dtype"), SHAPES,
                             ids=[f"{r}x{n}-{str(d)[6:]}" for r, n, d in SHAPES])
    def test_forward_matches_the_split_path_bit_for_bit(dtype, rows, n) -> None:
        x = _rows(rows, n, seed=n).to(dtype).to(DEVICE)
        parts = -(-n // 16)
        for name, fn in FORWARD.items():
            with launch_options(max_fused=16, chunk=16, resident=1):
                got = fn(x)
            assert _plan() == f"resident {parts}x16 (4 warps)", name
            with launch_options(max_fused=16, chunk=16, splits=parts, resident=-1):
                want = fn(x)
            assert _plan() == f"split {parts}x16 (16-chunks, 4 warps)", name
            assert torch.equal(_bits(got), _bits(want)), name
            assert got[1].isnan().all(), name
        assert (launch.row_counters(x, rows) == 0).all()  # each launch leaves them at zero

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_backward_matches_the_split_path_bit_for_bit(dtype) -> None:
        # per-row tau and beta, so each row's dtau and dbeta are compared, not only totals
        rows, n = 9, 50
        x = _rows(rows, n, seed=1).to(dtype).to(DEVICE)
        g = torch.randn(rows, n, generator=torch.Generator().manual_seed(2)).to(dtype)
        tau = torch.linspace(0.5, 2.0, rows)[:, None].to(DEVICE)
        beta = torch.linspace(0.0, 1.0, rows)[:, None].to(DEVICE)
        y = elastic_forward(x, 0.7, 0.5)
        with launch_options(max_fused=32, chunk=16, resident=1):
            got = elastic_backward_params(x, y, g.to(DEVICE), tau, beta)
        assert _plan() == "resident 4x16 (4 warps)"
        with launch_options(max_fused=32, chunk=16, splits=4, resident=-1):
            want = elastic_backward_params(x, y, g.to(DEVICE), tau, beta)
        assert _plan() == "split 4x16 (16-chunks, 4 warps)"
        for a, b, what in zip(got, want, ("dx", "dtau", "dbeta"), strict=True):
            assert torch.equal(_bits(a), _bits(b)), what
        assert got[0][1].isnan().all() and got[1][1].isnan().item()
        assert (got[0][2] == 0).all()  # +inf row: dx 0
        assert (launch.row_counters(x, rows) == 0).all()

    def test_refused_resident_launch_falls_back_to_the_split_path(monkeypatch) -> None:
        # a grid that cannot hold one row's programs: nothing is launched, the split path
        # runs and is what the call records; on a GPU the driver's refusal does the same
        x = _rows(5, 50, seed=3).to(DEVICE)
        with launch_options(max_fused=16, chunk=16, resident=-1, splits=4):
            want = FORWARD["softmax"](x)
        monkeypatch.setattr(launch, "_programs", lambda *args, **kwargs: 3)
        monkeypatch.setattr(launch, "_REFUSED", {})
        with launch_options(max_fused=16, chunk=16, resident=1):
            got = FORWARD["softmax"](x)
        assert _plan() == "split 4x16 (16-chunks, 4 warps)"
        assert torch.equal(_bits(got), _bits(want))
        assert list(launch._REFUSED.values()) == ["3 resident programs, fewer than a row's 4"]

    @triton.jit
    def _meet_kernel(cnt_ptr, out_ptr, SPLITS, LIMIT: tl.constexpr):
        """Every program meets at one counter, then writes its id: the barrier alone."""
        arrive_and_wait(cnt_ptr, SPLITS, LIMIT)
        tl.store(out_ptr + tl.program_id(0), tl.program_id(0) + 1)

    def test_the_barrier_wait_is_bounded_and_then_traps() -> None:
        from elasticbench.triton_interpreter import BarrierTrap

        # two programs of two meet: both pass
        cnt, out = torch.zeros(1, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
        launch.run(_meet_kernel, (2,), (cnt, out, 2), 4, {"LIMIT": 1 << 20}, cooperative=True)
        assert out.tolist() == [1, 2] and cnt.item() == 2
        # one program waiting for two never sees them: after LIMIT polls it traps (the launch
        # fails, as `trap` fails it on a GPU), long before the interpreter's hang watchdog,
        # and writes nothing computed past the barrier
        cnt, out = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        with pytest.raises(BarrierTrap, match="did not all reach its barrier"):
            launch.run(_meet_kernel, (1,), (cnt, out, 2), 4, {"LIMIT": 64}, cooperative=True)
        assert out.tolist() == [0]

    def test_captured_calls_use_counters_of_their_own(monkeypatch) -> None:
        # under capture (simulated) every resident launch takes a fresh zeroed buffer, not the
        # stream's cached one, and computes the same bits
        x = _rows(9, 50, seed=4).to(DEVICE)
        g = torch.randn(9, 50, generator=torch.Generator().manual_seed(5)).to(DEVICE)
        tau = torch.full((), 0.7)
        beta = torch.full((), 0.5)
        with launch_options(max_fused=32, chunk=16, resident=1):
            want = (FORWARD["elastic"](x),
                    *elastic_backward_params(x, FORWARD["elastic"](x), g, tau, beta))
        monkeypatch.setattr(launch, "_COUNTERS", {})
        monkeypatch.setattr(launch, "capturing", lambda device: True)
        made: list[torch.Tensor] = []
        real = launch.row_counters

        def spy(x: torch.Tensor, rows: int) -> torch.Tensor:
            made.append(real(x, rows))
            return made[-1]

        monkeypatch.setattr(launch, "row_counters", spy)
        with launch_options(max_fused=32, chunk=16, resident=1):
            PLANS.clear()
            y = FORWARD["elastic"](x)
            assert _plan() == "resident 4x16 (4 warps)"
            again = FORWARD["elastic"](x)  # a second graph's call: other counters
            PLANS.clear()
            got = (y, *elastic_backward_params(x, y, g, tau, beta))
            assert _plan() == "resident 4x16 (4 warps)"
        assert len(made) == 3 and len({t.data_ptr() for t in made}) == 3
        assert torch.equal(_bits(again), _bits(y))
        assert launch._COUNTERS == {}
        for a, b in zip(got, want, strict=True):
            assert torch.equal(_bits(a), _bits(b))
