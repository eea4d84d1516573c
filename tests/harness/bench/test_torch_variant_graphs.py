"""How many graphs the torch.compile variants compile: every process traces each one afresh,
so a shape class more is a fraction of a second more in every verification, per dtype.
The row shapes below cover every class of elasticbench/harness/builtin/torch_variants.py: one row or more, no
whole block, one, several, and last blocks of every width class (docs/numerics.md 6.7)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.ci  # compiles every variant: .ci/run, not make test

SHAPES = [(2, 1), (2, 3), (3, 256), (2, 257), (4, 258), (2, 511), (2, 513), (5, 1000),
          (2, 4097), (3, 8193), (2, 65537), (1, 65537), (1, 131071), (1, 1048577)]


def _graphs() -> dict[str, int]:
    """Graphs compiled so far, per compiled function of the variants."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from elasticbench.harness.builtin import torch_variants as tv

    return {name: len(_debug_get_cache_entry_list(fn._torchdynamo_orig_callable.__code__))
            for name, fn in tv._compiled.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_pass_compiles_one_graph_per_row_count_class(dtype: torch.dtype) -> None:
    from elasticbench.harness.builtin import torch_variants as tv

    before = _graphs()
    for shape in SHAPES:
        x = torch.randn(*shape, dtype=torch.float64).to(dtype)
        for kernel in (tv.elastic_three_pass, tv.elastic_online, tv.elastic_two_pass,
                       tv.elastic_exp_once, tv.compiled_elastic):
            kernel(x, tau=0.7, beta=0.5)
    new = {name: n - before.get(name, 0) for name, n in _graphs().items()}
    fused = new.pop("_fused")
    # one row, more rows: two graphs a pass; the scaling pass, whose inputs come out of a
    # pass, up to three more (n = 1, no whole block, one: their length-1 strides differ)
    scale = new.pop("_pass_scale")
    assert new and all(n <= 2 for n in new.values()) and scale <= 5, (new, scale)
    # _fused keeps backed sizes: one row; n = 1; no whole block; one; several
    assert fused <= 5, fused
