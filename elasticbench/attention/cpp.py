"""The fused CPU kernel of the native tier (kernels/cpp/attention.cpp) behind flash's contract.

forward(q, k, v, tau, beta, scale, causal) -> (out in q's dtype, m, den) and
backward(q, k, v, out, dO, m, den, tau, beta, scale, causal) -> (dq, dk, dv, dtau, dbeta),
exactly as `flash`, each with an optional (batch, length_k) bool key_mask; the C++ kernel flags +inf queries by m = +inf and NaN ones by m = NaN,
and `special` finishes the +inf ones here, as it does for every kernel. fp16 and bf16 are
converted to fp32 once, computed in fp32 and rounded once. docs/native.md section 5.
"""

from __future__ import annotations

import torch

from .. import devices, native
from . import special

# Queries and keys per tile: a 256 x 512 fp32 score tile (512 KiB; the backward keeps two)
# and the q, k and v blocks it needs stay in a 2 MiB L2 (docs/native.md section 5).
BLOCK_Q = 256
BLOCK_K = 512


def accepts(q: torch.Tensor) -> bool:
    """CPU tensors, when the native tier is built here."""
    return q.device.type == "cpu" and devices.native_unavailable() is None


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
            beta: torch.Tensor, scale: float, causal: bool, key_mask: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out in q's dtype, m, den) with m and den (batch, heads, length_q) in the work dtype;
    key_mask (batch, length_k) bool hides the keys where it is False inside the fused loop."""
    out, m, den = native.load().attention_forward(q, k, v, tau, beta, scale, causal,
                                                  BLOCK_Q, BLOCK_K, key_mask)
    special.fix_forward(q, k, v, out, m, den, scale, causal, key_mask)
    return out.to(q.dtype), m, den


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             do: torch.Tensor, m: torch.Tensor, den: torch.Tensor, tau: torch.Tensor,
             beta: torch.Tensor, scale: float, causal: bool, key_mask: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in q's dtype and (dtau, dbeta) per (batch, head) in the work dtype."""
    dq, dk, dv, dtau, dbeta = native.load().attention_backward(
        q, k, v, out, do, m, den, tau, beta, scale, causal, BLOCK_Q, BLOCK_K, key_mask)
    special.fix_backward(q, k, do, dv, m, scale, causal, key_mask)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dtau, dbeta
