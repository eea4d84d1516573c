"""Triton kernels under the Triton interpreter (or on a CUDA GPU when there is one).

The interpreter must be switched on before `triton.jit` decorates a kernel and it makes the
triton backend available, which would change what every other test sees in the registry.
So in an ordinary run this module holds one test, in two halves, that re-runs the module in
a subprocess with TRITON_INTERPRET=1; the real tests below run only inside that subprocess (or directly
with `TRITON_INTERPRET=1 pytest tests/library/test_triton.py`, or on a machine with CUDA).
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from elasticbench import devices

if devices.triton_unavailable() is not None:  # neither a GPU nor the interpreter here

    # shards of about a minute of interpreter each, in their own processes, so that
    # pytest-xdist's two workers share them evenly (one 250 s shard was CI's ci step's tail);
    # each process costs its imports again, so no more of them than that needs
    LONG = "passes_verification or split_and_grouped or many_chunk or long_rows"
    SHARDS = {"verification": "passes_verification",
              "plans": "split_and_grouped or many_chunk or long_rows", "rest": f"not ({LONG})"}

    @pytest.mark.ci
    @pytest.mark.parametrize("shard", list(SHARDS))
    def test_triton_kernels_under_the_interpreter(shard: str, under_interpreter) -> None:
        under_interpreter(__file__, "-k", SHARDS[shard], timeout=1800)

else:
    from elasticbench.harness.builtin import triton_kernels as registered
    from elasticbench.harness.numerics.truth.cache import TruthStore
    from elasticbench.harness.registry import list_kernels
    from elasticbench.harness.verify.matrix import builtin_case, expand, load_matrix
    from elasticbench.harness.verify.verifier import run_verification
    from elasticbench.kernels.triton.elastic_backward import elastic_backward
    from elasticbench.kernels.triton.exp_family import elastic_forward, exp_normalize
    from elasticbench.kernels.triton.launch import PLANS, LaunchOptions, launch_options
    from elasticbench.kernels.triton.params import FP32_MAX, FP32_MIN_NORMAL, LOG2E, exp2_scale

    # The interpreter evaluates both sides of every tl.where in NumPy, which warns about the
    # inf - inf and 0/0 it then throws away.
    pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

    DEVICE = "cuda" if devices.has_gpu() else devices.HOST
    DTYPES = (torch.float32, torch.float16, torch.bfloat16)
    # fused: the defaults; online: every row longer than 16 streams in chunks of 16, one
    # program a row; split: the same rows, three programs a row (fewer on rows of under three
    # chunks); rows: four rows a program (docs/triton.md, "Launch plans")
    PATHS = {"fused": {}, "online": {"max_fused": 16, "chunk": 16, "splits": 1},
             "split": {"max_fused": 16, "chunk": 16, "splits": 3}, "rows": {"row_block": 4}}
    # a comma-separated subset: the second Triton's run (tests/harness/audit/test_triton_versions.py)
    # checks the Triton-facing code on two paths, not every launch path again
    # (the forward verification's launch thresholds below too)
    if only := os.environ.get("ELASTICBENCH_TEST_TRITON_PATHS"):
        PATHS = {name: PATHS[name] for name in only.split(",")}
    NAN, INF = math.nan, math.inf

    @pytest.fixture(scope="module")
    def store(tmp_path_factory) -> TruthStore:
        """One truth cache for the module: both paths are checked against the same truths."""
        return TruthStore(tmp_path_factory.mktemp("truth"))

    @pytest.fixture(params=list(PATHS))
    def path(request):
        with launch_options(**PATHS[request.param]):
            yield request.param

    def _records(kernels, generators, store, max_elements=4096, keep=None) -> list[dict]:
        """The verification records of the quick matrix's cases of these generators (those
        `keep(case)` accepts, where given) in fp32, fp16 and bf16."""
        matrix = load_matrix(builtin_case("verify-quick"))
        cases = expand(matrix, sorted({k.function for k in kernels}),
                       ["fp32", "fp16", "bf16"], generators)
        cases = [c for c in cases if keep is None or keep(c)]
        assert cases
        records: list[dict] = []
        run_verification(kernels, cases, max_elements=max_elements, store=store,
                         workers=1, on_record=lambda r: records.append(r.to_dict()))
        return records

    def _failures(records: list[dict]) -> list[str]:
        return [f"{r['kernel']} {r['dtype']} {r['input']} {r['shape']} {r['params']}: "
                f"{r['reason']}" for r in records if not r["passed"]]

    # ---- forward: the suite's own verification against mpmath, in ulps ----------------

    # every generator of the quick matrix except the 8192-wide flat rows, which take the
    # interpreter minutes on 16-wide chunks (test_long_rows covers long rows)
    SHORT_GENERATORS = ["normal", "uniform", "all_negative", "all_zero", "relu_zeros",
                        "single_nonneg", "huge", "near_exp_limit", "ties_equal", "ties_max",
                        "dominant", "subnormal", "specials"]

    THRESHOLDS = {"fused": (16384, 4096, 0, 0), "online": (32, 32, 1, 0),
                  "split": (32, 32, 0, -1), "resident": (32, 32, 0, 1)}
    # the columns of the rows each plan streams: the shorter ones take the fused path, which
    # the fused plan verifies; on the resident plan, rows past 4 blocks of 32 take the split
    # path of the split plan
    STREAMED = {"online": (33, 1 << 30), "split": (33, 1 << 30), "resident": (33, 128)}
    # elastic's (tau, beta) on the streamed plans: both temperatures and both betas, the
    # sharp one with beta 0 (a row that keeps nothing divides 0/0 in the combine) and the
    # flat one with beta 1 (beta's term comparable to the sum); the fused plan takes the grid
    STREAMED_ELASTIC = [{"tau": 0.01, "beta": 0}, {"tau": 10, "beta": 1}]

    # every plan, or those of ELASTICBENCH_TEST_TRITON_PATHS
    FORWARD_PLANS = [p for p in THRESHOLDS if p in PATHS or (p == "resident" and not only)]

    def on_path(*names: str) -> pytest.MarkDecorator:
        """Skip a test of these launch paths where ELASTICBENCH_TEST_TRITON_PATHS leaves
        them all out (the second Triton's run: its Triton-facing code, not every path)."""
        return pytest.mark.skipif(not set(names) & set(PATHS),
                                  reason=f"{'/'.join(names)} not in ELASTICBENCH_TEST_TRITON_PATHS")

    def _streams_on(plan: str):
        """keep() for _records: the cases whose rows take `plan` (every case on fused)."""
        if plan == "fused":
            return None
        lo, hi = STREAMED[plan]
        return lambda c: lo <= c.shape[1] <= hi and (
            c.function != "elastic" or dict(c.params) in STREAMED_ELASTIC)

    @pytest.mark.parametrize("plan", FORWARD_PLANS)
    def test_forward_passes_verification(plan, store) -> None:
        kernels = [k for k in list_kernels(backend="triton", mode="fwd") if k.kind == "row"]
        assert {k.function for k in kernels} == {"elastic", "softmax", "softmax1",
                                                 "stablemax", "symax"}
        # online: rows of 33 and more, 32-wide chunks; split: those of few rows (the
        # interpreter's table fills 4 "SMs") several programs a row; resident: rows of 33 to
        # 128 in up to 4 blocks of 32 held across the row's barrier
        max_fused, chunk, splits, resident = THRESHOLDS[plan]
        PLANS.clear()
        with launch_options(max_fused=max_fused, chunk=chunk, splits=splits, resident=resident):
            records = _records(kernels, SHORT_GENERATORS, store, keep=_streams_on(plan))
        assert not _failures(records), "\n".join(_failures(records)[:20])
        assert all(r["special_ok"] for r in records)
        taken = {p.path for p in PLANS.values()}
        assert taken == ({"fused"} if plan == "fused" else {plan}), taken
        if plan != "fused":  # every function, and every generator of rows past 32, streams
            assert {r["kernel"] for r in records} == {k.name for k in kernels}
            # (dominant's rows are 256 wide: split, on the resident plan; the resident path
            # gives the split path's bits, tests/library/test_triton_resident.py)
            left_out = {"ties_equal", "specials"} | ({"dominant"} if plan == "resident" else set())
            assert {r["input"] for r in records} == set(SHORT_GENERATORS) - left_out
            elastic = {tuple(sorted(r["params"].items())) for r in records
                       if r["kernel"] == "triton_elastic"}
            assert elastic == {tuple(sorted(p.items())) for p in STREAMED_ELASTIC}, elastic

    def test_long_rows_online_path_verifies(store) -> None:
        # 8192-wide rows (flat, 1.0 repeated: where a low-precision sum stalls), 1024 chunks
        with launch_options(max_fused=1024, chunk=1024):
            rows = [k for k in list_kernels(backend="triton", mode="fwd") if k.kind == "row"]
            records = _records(rows, ["flat"], store,
                               max_elements=1 << 14)
        assert len(records) == 5 * 3
        assert not _failures(records), "\n".join(_failures(records))

    def _fp64_family(name: str, x: torch.Tensor) -> torch.Tensor:
        """The row family in float64 (eta = tau = beta = 1): far below an fp32 ulp off."""
        if name in ("stablemax", "symax"):
            w = torch.where(x >= 0, x + 1, 1 / (1 - x)) if name == "stablemax" else x.abs()
            return w / (w.sum() + (name == "symax"))
        keep = x >= 0 if name == "elastic" else torch.ones_like(x, dtype=torch.bool)
        m = torch.clamp(x[keep].max(), min=0.0) if name != "softmax" else x.max()
        e = torch.where(keep, torch.exp(x - m), 0.0)
        return e / (e.sum() + (torch.exp(-m) if name != "softmax" else 0.0))

    @on_path("online")
    def test_many_chunk_sums_stay_within_budget() -> None:
        # 1024 chunks of 16 that repeat one coarse chunk: every chunk sum is the same inexact
        # value, so adding them one after another rounds alike each time (stablemax drifted
        # to 72 ulp, against 18 allowed; on an H100 a 2^22 'coarse' row reached 26.3 > 26);
        # the running sum carries a compensation and stays within the log2(n) budget
        from elasticbench.harness.numerics.budgets.row_budgets import BUDGETS
        from elasticbench.harness.numerics.dtypes import get_format

        # one kernel of each family's online kernel: softmax, which sums every element, and
        # stablemax, which drifted (the others are the same loops with other constants)
        tile = torch.round(torch.randn(16, generator=torch.Generator().manual_seed(0)) * 64) / 64
        x = tile.repeat(1024)[None]
        rows = [k for k in list_kernels(backend="triton", mode="fwd") if k.kind == "row"
                and k.function in ("softmax", "stablemax")]
        assert len(rows) == 2
        for kernel in rows:
            with launch_options(max_fused=16, chunk=16):
                y = kernel.fn(x.to(DEVICE)).cpu().double()
            want = _fp64_family(kernel.function, x.double())[0]
            nz = want > 0
            ulp = torch.finfo(torch.float32).eps * torch.exp2(torch.floor(torch.log2(want[nz])))
            err = ((y[0] - want)[nz].abs() / ulp).numpy()
            z = (x[0] - x.max()).abs().double()[nz].numpy()  # the exponent's |z|, if any
            if kernel.function in ("stablemax", "symax"):
                z = np.zeros_like(z)
            allowed = BUDGETS["fp32"].allowance(z[None], np.zeros(1), x.shape[1],
                                                get_format("fp32"))[0]
            assert (y[0][~nz] == 0).all(), kernel.name
            assert (err <= allowed).all(), f"{kernel.name}: {(err - allowed).max():.3g} ulp over"

    # ---- split rows and several rows a program against one program a row ---------------

    FAMILY = {"elastic": {"tau": 0.5, "beta": 0.7}, "softmax": {}, "softmax1": {},
              "stablemax": {}, "symax": {"eta": 1.0}}

    def _family_rows(n: int = 200) -> torch.Tensor:
        """Ordinary rows, and special rows whose NaN and infinities fall in different splits."""
        x = torch.randn(8, n, generator=torch.Generator().manual_seed(11)) * 3
        x[0, [3, 150, n - 1]] = INF  # three infinities, three splits
        x[1, n // 2] = NAN
        x[2] = -1.0  # elastic keeps nothing
        x[3] = -INF
        x[4, [10, n - 10]] = torch.tensor([NAN, INF])
        x[5] = 0.0
        x[6, 60:] = -5.0  # the max in the first split only
        return x

    @functools.cache
    def _one_program_a_row(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Each row kernel's output on _family_rows(), in chunks of 16, one program a row: what
        the split and grouped plans are compared with (computed once per dtype)."""
        x = _family_rows().to(dtype)
        with launch_options(max_fused=16, chunk=16, splits=1):
            return {k.function: k.fn(x.to(DEVICE), **FAMILY[k.function]).cpu()
                    for k in list_kernels(backend="triton", mode="fwd") if k.kind == "row"}

    # 13 splits (one chunk each, the most partials to combine) in fp32; two (several chunks
    # each) and several rows a program in both: each plan once, each path in each dtype
    SPLIT_PLANS = {"2-splits": {"splits": 2}, "13-splits": {"splits": 13},
                   "rows": {"max_fused": 16384, "row_block": 4}}

    @on_path("split", "rows")
    @pytest.mark.parametrize(("dtype", "plan"), [
        (torch.float32, "2-splits"), (torch.float32, "13-splits"), (torch.float32, "rows"),
        (torch.bfloat16, "2-splits"), (torch.bfloat16, "rows")],
        ids=["fp32-2-splits", "fp32-13-splits", "fp32-rows", "bf16-2-splits", "bf16-rows"])
    def test_split_and_grouped_rows_match_one_program_a_row(dtype, plan) -> None:
        # 200-wide rows in 13 chunks of 16: the split path's combine against the online
        # kernel's running sums (special rows exactly, ordinary ones within 2 fp32 ulp), and
        # both against the fp64 family
        x = _family_rows().to(dtype)
        for kernel in [k for k in list_kernels(backend="triton", mode="fwd") if k.kind == "row"]:
            params = FAMILY[kernel.function]
            one = _one_program_a_row(dtype)[kernel.function]
            with launch_options(**{"max_fused": 16, "chunk": 16, **SPLIT_PLANS[plan]}):
                got = kernel.fn(x.to(DEVICE), **params).cpu()
            special = [0, 1, 3, 4] + ([2] if kernel.function == "elastic" else [])
            assert torch.equal(got[special].isnan(), one[special].isnan()), kernel.name
            assert torch.equal(got[special].nan_to_num(), one[special].nan_to_num()), kernel.name
            ordinary = [r for r in range(8) if r not in special]
            a, b = got[ordinary].double(), one[ordinary].double()
            spacing = torch.finfo(dtype).eps * b.abs().clamp_min(1e-30)
            assert ((a - b).abs() <= 2 * spacing).all(), kernel.name
            if kernel.function != "elastic":  # _fp64_family: tau = 1
                want = torch.stack([_fp64_family(kernel.function, x[r].double())
                                    for r in ordinary])
                tol = 64 * torch.finfo(dtype).eps
                torch.testing.assert_close(a, want, rtol=tol, atol=tol * want.abs().max())

    @functools.cache
    def _backward_one_program_a_row():
        """x, g, y and each row's backward alone in chunks of 16, one program a row (computed
        once): 6 rows of 200, a +inf row and a NaN row among them."""
        x, g = _backward_input(torch.float32, rows=6, n=200, seed=4)
        x[0, [5, 120]] = INF
        x[5, 150] = NAN
        y = elastic_forward(x, 0.7, 1.0)
        with launch_options(max_fused=16, chunk=16, splits=1):
            one = [elastic_backward(y[r:r + 1], g[r:r + 1], x[r:r + 1], 0.7, 1.0)
                   for r in range(6)]
        return x, g, y, one

    @on_path("split", "rows")
    @pytest.mark.parametrize("plan", [{"splits": 3}, {"splits": 13},
                                      {"max_fused": 16384, "row_block": 4}],
                             ids=["3-splits", "13-splits", "rows"])
    def test_split_and_grouped_backward_match_one_program_a_row(plan) -> None:
        x, g, y, one = _backward_one_program_a_row()
        with launch_options(**{"max_fused": 16, "chunk": 16, **plan}):
            dx, _, _ = elastic_backward(y, g, x, 0.7, 1.0)
            per_row = [elastic_backward(y[r:r + 1], g[r:r + 1], x[r:r + 1], 0.7, 1.0)
                       for r in range(6)]
        assert (dx[0] == 0).all() and dx[5].isnan().any()  # +inf row: 0; NaN row: NaN
        for r in range(6):
            assert torch.equal(dx[r].isnan(), one[r][0][0].isnan()), r
            # c = sum g y summed in another order: g - c cancels, so relative to the row
            scale = one[r][0][0].nan_to_num().abs().max().item()
            torch.testing.assert_close(dx[r], one[r][0][0], rtol=1e-6, atol=1e-5 * scale,
                                       equal_nan=True)
            for got, want in zip(per_row[r][1:], one[r][1:], strict=True):
                if math.isnan(want.item()):
                    assert math.isnan(got.item()), r
                else:
                    assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-9), r
        rdx, rdtau, rdbeta = _reference_grads(x[1:5], g[1:5], 0.7, 1.0)
        with launch_options(**{"max_fused": 16, "chunk": 16, **plan}):
            dx4, dtau4, dbeta4 = elastic_backward(y[1:5], g[1:5], x[1:5], 0.7, 1.0)
        scale = rdx.abs().max().item()
        torch.testing.assert_close(dx4.double().cpu(), rdx, rtol=2e-5, atol=2e-5 * scale)
        assert dtau4.item() == pytest.approx(rdtau.item(), rel=2e-5)
        assert dbeta4.item() == pytest.approx(rdbeta.item(), rel=2e-5)

    # ---- forward: the special-value policy, exactly ------------------------------------

    def _run(fn, rows, dtype, **params) -> torch.Tensor:
        x = torch.tensor(rows, dtype=torch.float32).to(dtype).to(DEVICE)
        before = x.clone()
        y = fn(x, **params)
        assert y.dtype == dtype and y.shape == x.shape
        assert torch.equal(x.view(torch.uint8), before.view(torch.uint8)), "modified its input"
        return y.float().cpu()

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("beta", [0.0, 1.0])
    def test_elastic_special_values(path, dtype, beta) -> None:
        n = 20
        rows = [
            [1.0, NAN] + [-1.0] * (n - 2),  # NaN: the whole row NaN
            [NAN] + [-2.0] * (n - 1),  # NaN among masked only: still NaN
            [INF, 3.0] + [-1.0] * (n - 2),  # one +inf: 1 there, 0 elsewhere
            [INF, 2.0, INF] + [-INF] * (n - 3),  # two +inf: 1/2 each
            [-1.0] * (n - 1) + [-INF],  # nothing kept: zeros, beta = 0 or not
            [-0.0, 0.0] * (n // 2),  # both zeros kept: 1 / (n + beta)
            [5.0, 5.0, 5.0] + [-3.0] * (n - 3),  # ties at m = 5: beta rescaled by exp(-5)
        ]
        y = _run(registered.triton_elastic, rows, dtype, tau=1.0, beta=beta)
        assert y[0].isnan().all() and y[1].isnan().all()
        assert y[2, 0] == 1 and (y[2, 1:] == 0).all()
        assert (y[3, [0, 2]] == 0.5).all() and (y[3, 1] == 0) and (y[3, 3:] == 0).all()
        assert (y[4] == 0).all() and not y[4].signbit().any()
        torch.testing.assert_close(y[5], torch.full((n,), 1 / (n + beta)), rtol=4e-3, atol=0)
        share = 1 / (3 + beta * math.exp(-5.0))  # the unrescaled bug gives 1/(3 + beta)
        torch.testing.assert_close(y[6, :3], torch.full((3,), share), rtol=4e-3, atol=0)
        assert (y[6, 3:] == 0).all()

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_family_special_values(path, dtype) -> None:
        n = 18
        rows = [
            [NAN] + [1.0] * (n - 1),
            [-INF] * n,
            [INF, INF, 1.0] + [-INF] * (n - 3),
            [0.0] * n,
        ]
        softmax = _run(registered.triton_softmax, rows, dtype)
        softmax1 = _run(registered.triton_softmax1, rows, dtype)
        stablemax = _run(registered.triton_stablemax, rows, dtype)
        symax = _run(registered.triton_symax, rows, dtype, eta=0.0)
        for y in (softmax, softmax1, stablemax, symax):
            assert y[0].isnan().all()
        for y in (softmax, softmax1, stablemax):
            assert (y[2, :2] == 0.5).all() and (y[2, 2:] == 0).all()
        # |-inf| is infinite too: symax shares among all n - 1 infinite logits
        torch.testing.assert_close(symax[2, [0, 1, 3]], torch.full((3,), 1 / (n - 1)),
                                   rtol=4e-3, atol=0)
        assert symax[2, 2] == 0
        assert (softmax[1] == 0).all() and (softmax1[1] == 0).all()  # no 0/0 NaN
        assert (stablemax[1] == 0).all()  # s(-inf) = 0: 0/0 -> 0
        assert (symax[3] == 0).all()  # eta = 0, all zero: 0/0 -> 0
        torch.testing.assert_close(softmax[3], torch.full((n,), 1 / n), rtol=4e-3, atol=0)
        torch.testing.assert_close(softmax1[3], torch.full((n,), 1 / (n + 1)), rtol=4e-3, atol=0)

    def test_fp64_is_refused_clearly() -> None:
        x = torch.zeros(2, 4, dtype=torch.float64, device=DEVICE)
        with pytest.raises(TypeError, match="fp32, fp16 and bf16"):
            registered.triton_elastic(x, tau=1.0, beta=0.0)
        specs = list_kernels(backend="triton")
        assert specs and all(k.dtypes == ("fp32", "fp16", "bf16") for k in specs)
        assert not any(k.supports("fp64") for k in specs)  # skipped by verify and run

    # ---- backward: against fp64 torch autograd of the reference composite --------------

    def _reference_grads(x: torch.Tensor, g: torch.Tensor, tau: float, beta: float):
        """dx, dtau, dbeta of sum(g * elastic(x)) in fp64 autograd (0/0 rows -> 0)."""
        x = x.double().cpu().requires_grad_(True)
        t = torch.tensor(tau, dtype=torch.float64, requires_grad=True)
        b = torch.tensor(beta, dtype=torch.float64, requires_grad=True)
        keep = x >= 0
        m = torch.where(keep, x, -INF).amax(-1, keepdim=True).detach()
        m = torch.where(m.isfinite(), m, 0)
        e = torch.where(keep, torch.exp((torch.where(keep, x, m) - m) / t), 0)
        den = e.sum(-1, keepdim=True) + b * torch.exp(-m / t)
        y = e / torch.where(den > 0, den, 1)
        (y * g.double().cpu()).sum().backward()
        return x.grad, t.grad, b.grad

    def _backward_input(dtype, rows=6, n=40, seed=0):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(rows, n, generator=gen)
        x[1] = -x[1].abs() - 0.5  # nothing kept
        x[2, :6] = 1.5  # ties at the max
        x[3, ::4] = -0.0  # -0.0 kept
        x[4] = x[4] * 8  # wide spread
        g = torch.randn(rows, n, generator=gen)
        return x.to(dtype).to(DEVICE), g.to(dtype).to(DEVICE)

    # tolerances relative to the largest reference value: y and g reach the kernel rounded
    # to the dtype, so its gradient can only be that close
    BWD_RTOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}

    TAU_BETA = [(1.0, 0.0), (0.5, 1.0), (4.0, 100.0), (0.05, 1e-10)]
    # the fused path: every (tau, beta) in every dtype; each other path: every (tau, beta)
    # once and every dtype at least once (tau and beta are runtime values of the same code)
    BACKWARD_CASES = [("fused", dtype, *tb) for dtype in DTYPES for tb in TAU_BETA] + [
        (name, DTYPES[i % len(DTYPES)], *tb) for name in PATHS if name != "fused"
        for i, tb in enumerate(TAU_BETA)]
    BACKWARD_CASES = [c for c in BACKWARD_CASES if c[0] in PATHS]

    @pytest.mark.parametrize(("path_name", "dtype", "tau", "beta"), BACKWARD_CASES,
                             ids=[f"{p}-{str(d)[6:]}-{t}-{b}" for p, d, t, b in BACKWARD_CASES])
    def test_elastic_backward_matches_fp64_autograd(path_name, dtype, tau, beta) -> None:
        x, g = _backward_input(dtype)
        with launch_options(**PATHS[path_name]):
            y = elastic_forward(x, tau, beta)
            dx, dtau, dbeta = elastic_backward(y, g, x, tau, beta)
        assert dx.dtype == dtype and dx.shape == x.shape
        assert dtau.dim() == 0 and dbeta.dim() == 0
        rdx, rdtau, rdbeta = _reference_grads(x, g, tau, beta)
        tol = BWD_RTOL[dtype]
        scale = rdx.abs().max().item()
        torch.testing.assert_close(dx.double().cpu(), rdx, rtol=tol, atol=tol * scale)
        assert (dx.cpu()[x.cpu() < 0] == 0).all()
        assert dtau.item() == pytest.approx(rdtau.item(), rel=tol, abs=tol * abs(rdtau.item()))
        assert dbeta.item() == pytest.approx(rdbeta.item(), rel=tol, abs=1e-30)
        # the registered bwd kernel is the same computation
        (spec,) = [k for k in list_kernels(backend="triton", mode="bwd") if k.kind == "row"]
        with launch_options(**PATHS[path_name]):
            dx2, dtau2, dbeta2 = spec.fn(x, y, g, tau=tau, beta=beta)
        assert torch.equal(dx2, dx) and torch.equal(dtau2, dtau) and torch.equal(dbeta2, dbeta)

    def test_elastic_backward_special_rows(path) -> None:
        n = 24
        x = torch.full((4, n), -1.0)
        x[0, :3] = torch.tensor([1.0, NAN, 2.0])  # NaN row
        x[1, :2] = INF  # +inf row: the limit, dtau and dbeta contributions 0
        x[2, :5] = torch.linspace(0, 2, 5)  # an ordinary row
        # row 3: nothing kept
        g = torch.linspace(-1, 1, 4 * n).reshape(4, n)
        y = elastic_forward(x.to(DEVICE), 1.0, 1.0)
        dx, dtau, dbeta = elastic_backward(y, g.to(DEVICE), x.to(DEVICE), 1.0, 1.0)
        dx = dx.cpu()
        assert dx[0].isnan().any() and math.isnan(dtau.item()) and math.isnan(dbeta.item())
        assert (dx[3] == 0).all()
        assert (dx[1] == 0).all()  # +inf row: its output is constant, so is sum(g y)
        # without the NaN row, dtau and dbeta come from the ordinary row alone
        keep = [1, 2, 3]
        _, dtau2, dbeta2 = elastic_backward(y[keep], g[keep].to(DEVICE),
                                               x[keep].to(DEVICE), 1.0, 1.0)
        _, rdtau, rdbeta = _reference_grads(x[2:3], g[2:3], 1.0, 1.0)
        assert dtau2.item() == pytest.approx(rdtau.item(), rel=2e-5)
        assert dbeta2.item() == pytest.approx(rdbeta.item(), rel=2e-5)

    def test_backward_reductions_are_deterministic(path) -> None:
        x, g = _backward_input(torch.float32, rows=29, n=40, seed=3)
        y = elastic_forward(x, 0.7, 1.0)
        first = elastic_backward(y, g, x, 0.7, 1.0)
        second = elastic_backward(y, g, x, 0.7, 1.0)
        for a, b in zip(first, second, strict=True):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))
        # the totals are the sums of the per-row contributions
        _, dtau8, dbeta8 = elastic_backward(y[:8], g[:8], x[:8], 0.7, 1.0)
        rows = [elastic_backward(y[i:i + 1], g[i:i + 1], x[i:i + 1], 0.7, 1.0)
                for i in range(8)]
        assert dtau8.item() == pytest.approx(sum(r[1].item() for r in rows), rel=1e-6)
        assert dbeta8.item() == pytest.approx(sum(r[2].item() for r in rows), rel=1e-6)

    # ---- long rows, extreme temperatures, launch geometry --------------------------------

    @pytest.mark.parametrize("splits", [1, 0], ids=["online", "split"])
    def test_four_million_wide_row_is_within_budget(splits) -> None:
        # 2^22 + 3 elements (a ragged last chunk) on the online path, or split (the table's
        # choice: 13 programs of 5 chunks); 64-Ki chunks keep the interpreter to seconds, the
        # chunk loop and running rescale are those of any chunk size
        from elasticbench.harness.numerics.budgets.row_budgets import BUDGETS

        n = (1 << 22) + 3
        x = torch.randn(1, n, generator=torch.Generator().manual_seed(5)) * 3
        with launch_options(max_fused=16384, chunk=1 << 16, splits=splits):
            y = elastic_forward(x.to(DEVICE), 1.0, 1.0).cpu().double()
        xd = x.double()
        keep = xd >= 0
        m = xd[keep].max()
        z = torch.where(keep, (xd - m).abs(), 0.0)
        e = torch.where(keep, torch.exp(xd - m), 0.0)
        ref = e / (e.sum() + torch.exp(-m))  # fp64: its error is far below an fp32 ulp
        ulp = torch.finfo(torch.float32).eps * torch.exp2(torch.floor(torch.log2(ref[keep])))
        err = ((y - ref)[keep].abs() / ulp).numpy()
        zbar = float((e * z).sum() / e.sum())
        from elasticbench.harness.numerics.dtypes import get_format

        allowed = BUDGETS["fp32"].allowance(z[keep].numpy()[None], torch.tensor([zbar]).numpy(),
                                            n, get_format("fp32"))[0]
        assert (y[~keep] == 0).all()
        assert (err <= allowed).all(), f"worst {err.max():.3g} ulp, {(err / allowed).max():.0%}"

    @pytest.mark.parametrize("tau", [1e-300, 1e-40, 1e-3, 7.0, 1e30, 1e300])
    def test_exp2_scale(tau) -> None:
        k, pre = exp2_scale(tau)
        assert math.frexp(pre)[0] == 0.5  # a power of two
        assert FP32_MIN_NORMAL <= k <= FP32_MAX
        if 1e-37 < tau < 1e37:  # k * pre represents log2(e)/tau: no clamp
            assert k * pre == pytest.approx(LOG2E / tau, rel=1e-15)

    @pytest.mark.parametrize("tau", [1e-300, 1e-40, 1e30, 1e300])
    def test_extreme_temperatures_reach_their_limits(tau) -> None:
        # tiny tau: one-hot on the kept max (ties share it); huge tau: uniform over the kept,
        # beta*exp(-m/tau) -> beta
        x = torch.tensor([[0.5, 2.0, -1.0, 2.0, 0.0, 1.0], [-3.0, 1e-30, 2e-30, -1.0, 0.0, 0.0]])
        y = elastic_forward(x.to(DEVICE), tau, 1.0).cpu()
        if tau < 1:
            want = torch.tensor([[0, 0.5, 0, 0.5, 0, 0], [0, 0, 1.0, 0, 0, 0]])
        else:
            want = torch.tensor([[1 / 6, 1 / 6, 0, 1 / 6, 1 / 6, 1 / 6], [0, 0.2, 0.2, 0, 0.2, 0.2]])
        torch.testing.assert_close(y, want, rtol=1e-6, atol=0)

    # ---- the model of the GPU's ex2 (LaunchOptions.exp2_ulps) ------------------------------

    # the second Triton's run leaves this out: the model's code runs there in the test below,
    # and what the budgets allow does not depend on the Triton
    @pytest.mark.skipif(bool(only), reason="the budgets under the ex2 model: the pinned "
                        "Triton's run (ELASTICBENCH_TEST_TRITON_PATHS is set)")
    def test_budgets_hold_with_a_flushing_two_ulp_exp2() -> None:
        # the CLI's way in: $ELASTICBENCH_TRITON_EXP2_ULPS
        env = {**devices.interpreter_env(on=True), "ELASTICBENCH_TRITON_EXP2_ULPS": "2"}
        cmd = [sys.executable, "-W", "ignore", "-m", "elasticbench", "verify", "--backend",
               "triton", "--quick", "-d", "fp32", "--mode", "both"]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert " 0 failed" in run.stdout

    def test_subnormal_outputs_survive_a_flushing_exp2() -> None:
        # exp(-100) = 3.7e-44 is an fp32 subnormal: a flushing ex2 loses it unless SUBNORMAL
        # (under the interpreter the model flushes; on a GPU the ex2 itself does)
        x = torch.tensor([[0.0, -100.0]], device=DEVICE)
        flushed, kept = (
            exp_normalize(x, tau=1.0, beta=0.0, nonneg=False, floor0=False, offset=False,
                          subnormal=sub, options=LaunchOptions(exp2_ulps=2))[0, 1].item()
            for sub in (False, True))
        assert flushed == 0.0
        # within one subnormal spacing (2^-149) of exp(-100)/(1 + exp(-100)) = 26.5 * 2^-149
        assert abs(kept - math.exp(-100)) <= 2.0 ** -149 and kept > 0
