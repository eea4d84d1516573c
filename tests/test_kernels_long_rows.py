"""The pass-structure variants of kernels/torch_variants.py on long rows of the `coarse`
input, against the exact reference: a row's sum is a sum of block sums, so its error grows
like log2(n), as the budget allows. Summed as one serial chain per vector lane, these rows
failed (fp64 2x65535: 29.9 ulp against 26.7; fp32 1x1048577: 76.8 against 28.5)."""

from __future__ import annotations

import numpy as np
import pytest

from elasticbench.execute import call_kernel
from elasticbench.inputs import generate
from elasticbench.numerics.budget import budget_for
from elasticbench.numerics.dtypes import get_format
from elasticbench.numerics.truth_cache import TruthJob, TruthStore, solve
from elasticbench.registry import get_kernel
from elasticbench.verify.check import check_output

pytestmark = pytest.mark.ci  # each variant compiles for these shapes: .ci/run, not make test

VARIANTS = ["elastic_three_pass", "elastic_online", "elastic_two_pass", "elastic_exp_once",
            "compiled_elastic", "elastic_accurate"]
PARAMS = {"tau": 1.0, "beta": 1.0}


@pytest.mark.parametrize(("dtype", "shape"), [("fp64", (2, 65535)), ("fp32", (1, 1048577)),
                                              ("fp32", (2, 6145))])
def test_long_rows_stay_within_the_log2_budget(dtype, shape):
    x = generate("coarse", dtype, shape, 20261121)
    job = TruthJob("elastic", tuple(PARAMS.items()), dtype, x.astype(np.float64),
                   np.arange(shape[0]), 128)
    (truth,) = solve([job], TruthStore(None), workers=1)
    fmt = get_format(dtype)
    for name in VARIANTS:
        out = call_kernel(get_kernel(name), x, PARAMS)
        assert out.error is None, f"{name}: {out.error}"
        verdict = check_output(x, out.output, truth, fmt, budget_for(fmt))
        assert verdict.passed, f"{name}: {verdict.reason} {verdict.worst}"
        # a margin, not just a pass: blocked sums leave most of the budget unused
        assert verdict.max_budget_frac is not None and verdict.max_budget_frac < 0.6, name
