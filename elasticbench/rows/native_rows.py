"""The native C++ rows (elasticbench.native, docs/native.md): CPU tensors of the four float
dtypes, with one tau and offset for every row or one per row (per head, say: the kernels
read row r's from fp64 arrays), where the extension builds. The forward is the fused pass
structure.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from .. import devices, native
from ..dispatch import Implementation
from .param_layout import Scalar
from .spec import Backward, ExpSpec

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def extension() -> ModuleType | None:
    """The native C++ kernels, or None where they do not build."""
    return None if devices.native_unavailable() else native.load()


def accepts(x: torch.Tensor, spec: ExpSpec) -> bool:
    return x.device.type == "cpu" and x.dtype in DTYPES and extension() is not None


def _per_row(v: Scalar | None, x: torch.Tensor) -> torch.Tensor | None:
    """A per-row parameter ((..., 1), broadcasting against x) as one fp64 value per row;
    None for a float or a 0-d tensor (the kernels' scalar path)."""
    if not isinstance(v, torch.Tensor) or v.ndim == 0:
        return None
    return v.detach().expand(*x.shape[:-1], 1).reshape(-1).to(torch.float64).contiguous()


def _scalar(v: Scalar | None) -> float:
    return 0.0 if v is None else float(v)


def _rows(x: torch.Tensor, spec: ExpSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
    """tau and the offset per row, where either is per row."""
    tau, offset = _per_row(spec.tau, x), _per_row(spec.offset, x)
    if tau is None and offset is None:
        return None
    rows = x.numel() // max(x.shape[-1], 1) if x.ndim else 1
    return tuple(torch.full((rows,), _scalar(v), dtype=torch.float64) if t is None else t
                 for t, v in ((tau, spec.tau), (offset, spec.offset)))  # type: ignore[return-value]


def forward(x: torch.Tensor, spec: ExpSpec) -> torch.Tensor:
    ext = extension()
    assert ext is not None
    if (per := _rows(x, spec)) is not None:
        return ext.exp_forward_rows(x, spec.mask_negative, spec.floor, *per)
    return ext.exp_forward(x, ext.Structure.FUSED, spec.mask_negative, spec.floor,
                           _scalar(spec.tau), _scalar(spec.offset))


def backward(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, spec: ExpSpec,
             params: bool) -> Backward:
    ext = extension()
    assert ext is not None
    if (per := _rows(x, spec)) is not None:
        dx, dtau, doffset = ext.exp_backward_rows(x, y, g, spec.mask_negative, *per, params)
    else:
        dx, dtau, doffset = ext.exp_backward(x, y, g, spec.mask_negative, _scalar(spec.tau),
                                             _scalar(spec.offset), params)
    if not params:
        return dx, None, None
    rows = (*x.shape[:-1], 1)
    return dx, dtau.reshape(rows), doffset.reshape(rows)


CPP = Implementation("cpp", accepts, forward, backward)
