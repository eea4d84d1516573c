"""Shapes of attention's operands and parameters, checked once (docs/attention.md section 1).

q is (batch, heads, length_q, head_dim), k is (batch, heads, length_k, head_dim) and v is
(batch, heads, length_k, value_dim), as torch.nn.functional.scaled_dot_product_attention
takes them. tau and beta are each a float, a 0-d tensor, a 1-d tensor of one value per head,
or a tensor that broadcasts against (batch, heads, 1, 1) (such as (heads, 1, 1)).

Causal masking hides key j from query i unless j <= i + offset, one integer: 0 aligns it
top-left (SDPA's is_causal), length_k - length_q bottom-right (FlashAttention's, and a decode
step's against its cache); `causal_offset` turns the public spellings into it
(docs/attention.md section 1).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..rows.param_layout import Scalar, work_dtype

__all__ = ["Scalar", "causal_offset", "check_operands", "default_scale", "head_params",
           "key_padding", "visible", "work_dtype"]


def causal_offset(causal: bool | str, length_q: int, length_k: int) -> int | None:
    """The causal diagonal's offset for `causal` (query i sees key j iff j <= i + offset):
    None for False (no mask), 0 for True or "top_left", length_k - length_q for
    "bottom_right"; ValueError in one line for anything else."""
    if causal is None:
        return None
    if isinstance(causal, str):
        if causal == "top_left":
            return 0
        if causal == "bottom_right":
            return length_k - length_q
    elif isinstance(causal, bool | int | np.bool_) and causal in (0, 1):  # 0 / 1 as before
        return 0 if causal else None
    raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right', got "
                     f"{causal!r}")


def check_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError (or TypeError) in one line when q, k, v cannot be attended together."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor")
        if t.ndim != 4:
            raise ValueError(f"{name} must be (batch, heads, length, dim), got shape "
                             f"{tuple(t.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError("q, k, v must be on the same device")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"q, k, v must share (batch, heads): {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must share head_dim: {q.shape[3]} != {k.shape[3]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must share length: {k.shape[2]} != {v.shape[2]}")


def default_scale(head_dim: int) -> float:
    """1/sqrt(head_dim), SDPA's default."""
    return 1.0 / math.sqrt(head_dim)


def head_params(value: Scalar, batch: int, heads: int, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor | float:
    """tau or beta laid out against (batch, heads, 1, 1): a float stays a float, a tensor
    becomes a 4-d tensor in `dtype` that broadcasts against it, keeping its autograd graph
    (a gradient flows back through the layout)."""
    if not isinstance(value, torch.Tensor):
        return float(value)
    t = value.to(device=device, dtype=dtype)
    if t.ndim == 0:
        return t.reshape(1, 1, 1, 1)
    if t.ndim == 1:
        t = t.reshape(-1, 1, 1)  # one value per head
    if t.ndim > 4:
        raise ValueError(f"a parameter of shape {tuple(value.shape)} has more than 4 dims")
    t = t.reshape((1,) * (4 - t.ndim) + tuple(t.shape))
    if t.shape[2:] != (1, 1):
        raise ValueError(f"a parameter of shape {tuple(value.shape)} must have size 1 along "
                         "both lengths (one value per batch and head at most)")
    try:
        torch.broadcast_shapes(t.shape, (batch, heads, 1, 1))
    except RuntimeError:
        raise ValueError(f"a parameter of shape {tuple(value.shape)} does not broadcast "
                         f"against (batch={batch}, heads={heads})") from None
    return t


def key_padding(attn_mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> torch.Tensor | None:
    """A bool attn_mask that only hides keys, the same for every head and query ((B, 1, 1,
    Lk), (1, 1, 1, Lk), (1, Lk) or (Lk,)), as a contiguous (batch, length_k) bool tensor for
    the fused kernels; None for any other mask (it takes the materialized path)."""
    if attn_mask.dtype != torch.bool or not 1 <= attn_mask.ndim <= 4:
        return None
    m = attn_mask.reshape((1,) * (4 - attn_mask.ndim) + tuple(attn_mask.shape))
    if m.shape[1:3] != (1, 1) or m.shape[3] != k.shape[2] or m.shape[0] not in (1, q.shape[0]):
        return None
    return m[:, 0, 0, :].to(q.device).expand(q.shape[0], k.shape[2]).contiguous()


def visible(length_q: int, length_k: int, device: torch.device, q0: int = 0,
            k0: int = 0, offset: int = 0) -> torch.Tensor:
    """(length_q, length_k) bool: key k0 + j is visible to query q0 + i under the causal
    mask of diagonal `offset` (k0 + j <= q0 + i + offset; 0: top-left)."""
    i = torch.arange(q0, q0 + length_q, device=device)[:, None]
    j = torch.arange(k0, k0 + length_k, device=device)[None, :]
    return j <= i + offset
