"""tau and beta laid out against rows-last x, and their gradients summed back onto them.

Each is a Python float, a 0-d tensor, or a tensor that broadcasts against x like an
elementwise operand and has size 1 along `dim` (one value per row at most), e.g. shape
(H, 1, 1) for one value per head of scores (B, H, L, L).
"""

from __future__ import annotations

import torch

Scalar = float | torch.Tensor


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 and fp32 compute in their own precision; fp16 and bf16 in fp32."""
    return dtype if dtype in (torch.float64, torch.float32) else torch.float32


def as_rows(v: Scalar | None, x: torch.Tensor, dim: int, dtype: torch.dtype,
            keep_graph: bool = False) -> Scalar | None:
    """tau/beta laid out for rows-last x: a float (or None) stays, a tensor becomes (..., 1)
    (detached from autograd's graph unless keep_graph)."""
    if not isinstance(v, torch.Tensor):
        return v
    t = (v if keep_graph else v.detach()).to(device=x.device, dtype=dtype)
    if t.ndim == 0:
        return t
    if t.ndim > x.ndim:
        raise ValueError(f"a parameter of shape {tuple(v.shape)} has more dims than x {tuple(x.shape)}")
    t = t.reshape((1,) * (x.ndim - t.ndim) + tuple(t.shape))
    if t.shape[dim] != 1:
        raise ValueError(
            f"a parameter of shape {tuple(v.shape)} must have size 1 along dim {dim} "
            f"(one value per row at most) for x of shape {tuple(x.shape)}"
        )
    try:
        torch.broadcast_shapes(t.shape, x.shape)
    except RuntimeError:
        raise ValueError(
            f"a parameter of shape {tuple(v.shape)} does not broadcast against x {tuple(x.shape)}"
        ) from None
    return t.movedim(dim, -1)

