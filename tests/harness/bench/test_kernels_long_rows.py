"""The pass-structure variants of elasticbench/harness/builtin/torch_variants.py on long rows of the `coarse`
input, against the exact reference: a row's sum is a sum of block sums, so its error grows
like log2(n), as the budget allows. Summed as one serial chain per vector lane, these rows
failed (fp64 2x65535: 29.9 ulp against 26.7; fp32 1x1048577: 76.8 against 28.5). The same
holds inside a block: `hunt` found rows of long runs of equal values that a 2048-wide block,
summed per vector lane, took past the budget (fp64 1x2049: 21 ulp against 15.1; 1x1884:
15.2 against 14.9)."""

from __future__ import annotations

import numpy as np
import pytest

from elasticbench.harness.execute import call_kernel
from elasticbench.harness.inputs import generate
from elasticbench.harness.numerics.budgets.row_budgets import budget_for
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.numerics.truth.cache import TruthJob, TruthStore, solve
from elasticbench.harness.registry import get_kernel
from elasticbench.harness.verify.check import check_output

pytestmark = pytest.mark.ci  # each variant compiles for these shapes: .ci/run, not make test

VARIANTS = ["elastic_three_pass", "elastic_online", "elastic_two_pass", "elastic_exp_once",
            "compiled_elastic", "elastic_accurate"]
PARAMS = {"tau": 1.0, "beta": 1.0}


def _judge_variants(x: np.ndarray, dtype: str, params: dict[str, float], margin: float
                    ) -> None:
    """Every variant on x against the exact reference: passed, using under `margin` of the
    budget."""
    job = TruthJob("elastic", tuple(params.items()), dtype, x.astype(np.float64),
                   np.arange(x.shape[0]), 128)
    (truth,) = solve([job], TruthStore(None), workers=1)
    fmt = get_format(dtype)
    for name in VARIANTS:
        out = call_kernel(get_kernel(name), x, params)
        assert out.error is None, f"{name}: {out.error}"
        verdict = check_output(x, out.output, truth, fmt, budget_for(fmt))
        assert verdict.passed, f"{name}: {verdict.reason} {verdict.worst}"
        assert verdict.max_budget_frac is not None and verdict.max_budget_frac < margin, name


def _runs(*runs: tuple[float, int]) -> np.ndarray:
    """One row of the given (value, count) runs, in order."""
    return np.concatenate([np.full(count, value) for value, count in runs])[None, :]


@pytest.mark.parametrize(("x", "params"), [
    # found by `hunt --budget 120` (seed 0) on elastic_online and elastic_two_pass, shrunk
    (_runs((2.721586256322175, 1056), (1.7660222344799148, 650), (1.6840553524727704, 10),
           (2.721586256322175, 333)), {"tau": 0.4, "beta": 1.0}),
    (_runs((-0.8360328677222613, 127), (0.4909237430774839, 31), (-0.8360328677222613, 728),
           (0.4909237430774839, 998)), {"tau": 141.6, "beta": 1.0}),
])
def test_long_runs_inside_one_block_stay_within_budget(x, params):
    _judge_variants(x, "fp64", params, margin=0.5)


@pytest.mark.parametrize(("dtype", "shape"), [("fp64", (2, 65535)), ("fp32", (1, 1048577)),
                                              ("fp32", (2, 6145))])
def test_long_rows_stay_within_the_log2_budget(dtype, shape):
    # a margin, not just a pass: blocked sums leave most of the budget unused
    _judge_variants(generate("coarse", dtype, shape, 20261121), dtype, PARAMS, margin=0.6)
