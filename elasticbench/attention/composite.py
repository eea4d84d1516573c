"""The eager composite: the readable reference implementation of Elastic attention.

    scores = scale * q @ k^T                 (causally hidden keys set to -inf)
    w      = elastic_softmax(scores, tau, beta)
    out    = w @ v                           (exactly 0 for a query that keeps no key)

It materializes the (length_q, length_k) score matrix of every head, so it needs
O(length^2) memory; the tiled implementation (`flash`) computes the same function in
O(length). Gradients flow through Elastic-Softmax's hand-written backward.
"""

from __future__ import annotations

import math

import torch

from ..rows.ops import along
from ..rows.spec import ELASTIC
from .layout import Scalar, default_scale, head_params, visible, work_dtype


def scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """scale * q @ k^T in the working precision, causally hidden keys at -inf."""
    wd = work_dtype(q.dtype)
    s = (q.to(wd) @ k.to(wd).transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~visible(q.shape[2], k.shape[2], q.device), -math.inf)
    return s


def with_mask(s: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
    """Scores s (B, H, Lq, Lk) under an SDPA-style mask: bool (True takes part: the others
    at -inf) or float (added, so a key whose masked score is negative is dropped)."""
    try:
        torch.broadcast_shapes(attn_mask.shape, s.shape)
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast "
                         f"against the scores {tuple(s.shape)}") from None
    if attn_mask.dtype == torch.bool:
        return s.masked_fill(~attn_mask, -math.inf)
    if not attn_mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool or floating point, got {attn_mask.dtype}")
    return s + attn_mask.to(s.dtype)


def elastic_attention_composite(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                                tau: Scalar, beta: Scalar, scale: float | None = None,
                                causal: bool = False, attn_mask: torch.Tensor | None = None
                                ) -> torch.Tensor:
    """Elastic attention by materializing the scores (differentiable through autograd),
    under attn_mask where one is given (see with_mask)."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    s = scores(q, k, scale, causal)
    if attn_mask is not None:
        s = with_mask(s, attn_mask)
    b, h = q.shape[:2]
    t, bt = (head_params(p, b, h, s.dtype, s.device) for p in (tau, beta))
    w = along(s, t, bt, -1, ELASTIC)  # elastic_softmax's op, below the public API
    out = w @ v.to(s.dtype)
    # a query with no kept key gives 0 even where v holds NaN or inf (0 @ NaN is NaN)
    live = (s >= 0).any(-1, keepdim=True) | s.isnan().any(-1, keepdim=True)
    return torch.where(live, out, 0).to(q.dtype)

