"""The Triton tier of the autograd path (elasticbench.rows.tiers): Elastic-Softmax on CUDA
tensors (fp32, fp16, bf16) with one tau and beta for every row, or one per row (per head, per batch: the
kernels read row r's from a table, and the backward returns per-row dtau and dbeta that
elasticbench.rows reduces to the parameters' shapes); softmax and softmax1 take the torch
code, and so do per-row parameters outside the kernels' domain (exp_family.row_param_table).

Importing this module registers the tier with elasticbench.rows and no kernel with the
registry (that is triton_kernels's job); Triton itself is imported on the first CUDA
tensor, and where it does not import the tier declines and the torch code serves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from elasticbench.rows.layout import Scalar
from elasticbench.rows.tiers import Backward, ExpSpec, Tier, register_tier

from .launch import SUPPORTED_DTYPES  # launch imports no Triton


class Kernels(NamedTuple):
    forward: Callable[..., torch.Tensor]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    forward_rows: Callable[..., torch.Tensor]
    backward_rows: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    table: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]


@functools.lru_cache(maxsize=1)
def kernels() -> Kernels | None:
    """The Triton kernels (scalar and per-row parameters), or None where Triton fails."""
    try:
        from .elastic_backward import elastic_backward, elastic_backward_rows
        from .exp_family import elastic_forward, elastic_forward_rows, row_param_table
    except Exception:  # absent, or Triton unusable here: the torch code serves
        return None
    return Kernels(elastic_forward, elastic_backward, elastic_forward_rows,
                   elastic_backward_rows, row_param_table)


def accepts(x: torch.Tensor, spec: ExpSpec) -> bool:
    """Elastic-Softmax (the kernels mask negatives) on fp32/fp16/bf16 CUDA tensors, scalar
    tau and beta or per-row ones the kernels take; float64 takes the torch code."""
    if not (x.is_cuda and x.dtype in SUPPORTED_DTYPES and spec.mask_negative and kernels() is not None):
        return False
    return spec.scalar() or _table(x, spec) is not None


def _per_row(v: Scalar | None, x: torch.Tensor) -> torch.Tensor:
    """A parameter (float, 0-d or (..., 1) tensor) as one value per row of x."""
    rows = x.numel() // max(x.shape[-1], 1)
    if not isinstance(v, torch.Tensor):
        return torch.full((rows,), float(v or 0.0), dtype=torch.float64, device=x.device)
    return v.detach().expand(*x.shape[:-1], 1).reshape(rows)


def _table(x: torch.Tensor, spec: ExpSpec) -> torch.Tensor | None:
    """The per-row parameter table of the kernels (None: outside their domain)."""
    k = kernels()
    assert k is not None
    return k.table(_per_row(spec.tau, x), _per_row(spec.offset, x))


def forward(x: torch.Tensor, spec: ExpSpec) -> torch.Tensor:
    k = kernels()
    assert k is not None and spec.offset is not None
    shape = x.shape
    x2d = x.reshape(-1, shape[-1]).contiguous()
    if not spec.scalar():
        table = _table(x, spec)
        assert table is not None
        return k.forward_rows(x2d, table).reshape(shape)
    y = k.forward(x2d, float(spec.tau), float(spec.offset))
    return y.reshape(shape)


def backward(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, spec: ExpSpec,
             params: bool) -> Backward:
    """dx, and dtau and dbeta: per row ((..., 1)) for per-row parameters (None unless
    `params`), else summed over every row (shape (1,)), whatever `params`."""
    k = kernels()
    assert k is not None and spec.offset is not None
    n = x.shape[-1]
    if not spec.scalar():
        table = _table(x, spec)
        assert table is not None
        dx, dtau, dbeta = k.backward_rows(y.reshape(-1, n).contiguous(),
                                          g.reshape(-1, n).contiguous(),
                                          x.reshape(-1, n).contiguous(), table)
        if not params:
            return dx.reshape(x.shape), None, None
        rows = (*x.shape[:-1], 1)
        return dx.reshape(x.shape), dtau.reshape(rows), dbeta.reshape(rows)
    dx, dtau, dbeta = k.backward(y.reshape(-1, n), g.reshape(-1, n).contiguous(),
                                 x.reshape(-1, n).contiguous(), float(spec.tau),
                                 float(spec.offset))
    return (dx.reshape(x.shape), torch.as_tensor(dtau, device=x.device).reshape(1),
            torch.as_tensor(dbeta, device=x.device).reshape(1))


TRITON = register_tier(Tier("triton", accepts, forward, backward))
