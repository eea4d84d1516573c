"""The fused CPU kernel of the native tier (kernels/cpp/attention.cpp) behind the contract of
`weights`, for every weight of `weights.Weight`:

    forward(q, k, v, p_score, p_den, scale, causal, key_mask=None, weight=Weight.ELASTIC,
            offset=0, gate=None, keep_ungated=False) -> (out in q's dtype, m, den[, ungated])
    backward(q, k, v, out, dout, m, den, p_score, p_den, scale, causal, key_mask=None,
             weight=Weight.ELASTIC, offset=0) -> (dq, dk, dv, dp_score, dp_den)

p_score and p_den are the weight's two parameter slots as weights.py names them (Elastic's
tau and beta, in that order), each a (batch, heads) tensor in any strides (a broadcast one,
stride 0, is read in place). causal: query i sees key j iff j <= i + offset. q, k, v, out
and dout are read where they lie (any (batch, head, row) strides with contiguous rows: a
transposed (batch, length, heads, dim) view costs no copy). key_mask is an optional (batch,
length_k) bool. The C++ kernel flags queries with an infinite weight by
m = +inf and NaN ones by m = NaN, and `special` finishes the infinite ones here, as it does
for every kernel. fp16 and bf16 are converted to fp32 once, computed in fp32 and rounded
once. A gate multiplies the output in the kernel's epilogue, in the work dtype, the ungated
output written beside it with keep_ungated (`weights`' contract). docs/native.md section 5.
"""

from __future__ import annotations

import torch

from .. import native
from ..rows.native_rows import extension
from . import special
from .weights import Weight

# Queries and keys per tile: a 256 x 512 fp32 score tile (512 KiB; the backward keeps two)
# and the q, k and v blocks it needs stay in a 2 MiB L2 (docs/native.md section 5).
BLOCK_Q = 256
BLOCK_K = 512

# The weights the C++ kernel is instantiated for (attention.h's AttnWeight).
WEIGHTS = frozenset(Weight)


def accepts(q: torch.Tensor, weight: Weight | int = Weight.ELASTIC) -> bool:
    """CPU tensors and a weight the kernel has, when the native tier is built here."""
    return q.device.type == "cpu" and weight in WEIGHTS and extension() is not None


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p_score: torch.Tensor,
            p_den: torch.Tensor, scale: float, causal: bool,
            key_mask: torch.Tensor | None = None, weight: Weight | int = Weight.ELASTIC,
            offset: int = 0, gate: torch.Tensor | None = None, keep_ungated: bool = False
            ) -> tuple[torch.Tensor, ...]:
    """(out in q's dtype, m, den) with m and den (batch, heads, length_q) in the work dtype;
    key_mask (batch, length_k) bool hides the keys where it is False inside the fused loop;
    with keep_ungated, (out, m, den, ungated) (`weights`' contract for the gate)."""
    weight = int(weight)  # the extension refuses a weight it does not have
    offset = offset if causal else 0
    if gate is None and not keep_ungated:  # the common call, as before the gate
        out, m, den = native.load().attention_forward(q, k, v, p_score, p_den, scale, causal,
                                                      BLOCK_Q, BLOCK_K, key_mask, weight,
                                                      offset)
        special.fix_forward(q, k, v, out, m, den, scale, causal, key_mask, weight, offset)
        return _as(out, q.dtype), m, den
    parts = native.load().attention_forward(q, k, v, p_score, p_den, scale, causal, BLOCK_Q,
                                            BLOCK_K, key_mask, weight, offset, gate,
                                            keep_ungated)
    out, m, den = parts[:3]
    ungated = parts[3] if keep_ungated and gate is not None else None
    special.fix_forward(q, k, v, out, m, den, scale, causal, key_mask, weight, offset,
                        gate=gate, ungated=ungated)
    if not keep_ungated:
        return _as(out, q.dtype), m, den
    gated = _as(out, q.dtype)
    return gated, m, den, (gated if ungated is None else _as(ungated, q.dtype))


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             do: torch.Tensor, m: torch.Tensor, den: torch.Tensor, p_score: torch.Tensor,
             p_den: torch.Tensor, scale: float, causal: bool,
             key_mask: torch.Tensor | None = None, weight: Weight | int = Weight.ELASTIC,
             offset: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in q's dtype and (dp_score, dp_den) per (batch, head) in the work dtype."""
    weight = int(weight)
    offset = offset if causal else 0
    dq, dk, dv, dp_score, dp_den = native.load().attention_backward(
        q, k, v, out, do, m, den, p_score, p_den, scale, causal, BLOCK_Q, BLOCK_K, key_mask,
        weight, offset)
    special.fix_backward(q, k, do, dv, m, scale, causal, key_mask, weight, offset)
    return _as(dq, q.dtype), _as(dk, q.dtype), _as(dv, q.dtype), dp_score, dp_den


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype: itself where it is already (a call's fixed cost, not a copy)."""
    return t if t.dtype == dtype else t.to(dtype)
