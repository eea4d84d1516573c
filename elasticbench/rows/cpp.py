"""The native C++ tier (elasticbench.native, docs/native.md): CPU tensors of the four float
dtypes with one tau and offset for every row (per-row ones take the torch code), where the
extension builds. The forward is the fused pass structure.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from .. import devices, native
from .tiers import Backward, ExpSpec, Tier, register_tier

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def extension() -> ModuleType | None:
    """The native C++ kernels, or None where they do not build."""
    return None if devices.native_unavailable() else native.load()


def accepts(x: torch.Tensor, spec: ExpSpec) -> bool:
    return (x.device.type == "cpu" and spec.scalar() and x.dtype in DTYPES
            and extension() is not None)


def _offset(spec: ExpSpec) -> float:
    return 0.0 if spec.offset is None else float(spec.offset)


def forward(x: torch.Tensor, spec: ExpSpec) -> torch.Tensor:
    ext = extension()
    assert ext is not None
    return ext.exp_forward(x, ext.Structure.FUSED, spec.mask_negative, spec.floor,
                           float(spec.tau), _offset(spec))


def backward(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, spec: ExpSpec,
             params: bool) -> Backward:
    ext = extension()
    assert ext is not None
    dx, dtau, doffset = ext.exp_backward(x, y, g, spec.mask_negative, float(spec.tau),
                                         _offset(spec), params)
    if not params:
        return dx, None, None
    rows = (*x.shape[:-1], 1)
    return dx, dtau.reshape(rows), doffset.reshape(rows)


CPP = register_tier(Tier("cpp", accepts, forward, backward))
