"""The eager composites: the readable reference implementations of the family's attention.

    scores = scale * q @ k^T                 (causally hidden keys set to -inf: key j is
                                              hidden from query i when j > i + offset)
    w      = elastic_softmax(scores, tau, beta)
    out    = w @ v                           (exactly 0 for a query that keeps no key)

`elastic_attention_composite` is Elastic attention; `attention_weights` and
`attention_composite` are the same for any weight of attention/weights.py (Weight; Cog's
weights are `cog_weights`), with the parameters p_score and p_den as weights.py names them,
in plain differentiable torch (second orders exact through autograd; docs/attention.md
section 9). They materialize the (length_q, length_k) score matrix of every head, so they
need O(length^2) memory; the tiled implementations compute the same functions in O(length).
"""

from __future__ import annotations

import math

import torch

from ..rows.ops import along
from ..rows.spec import ELASTIC, SOFTMAX1
from .operands import Scalar, default_scale, head_params, visible, work_dtype
from .weights import Weight


def scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool,
           offset: int = 0) -> torch.Tensor:
    """scale * q @ k^T in the working precision, causally hidden keys (j > i + offset) at
    -inf."""
    wd = work_dtype(q.dtype)
    s = (q.to(wd) @ k.to(wd).transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~visible(q.shape[2], k.shape[2], q.device, offset=offset),
                          -math.inf)
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
                                causal: bool = False, attn_mask: torch.Tensor | None = None,
                                offset: int = 0) -> torch.Tensor:
    """Elastic attention by materializing the scores (differentiable through autograd),
    under attn_mask where one is given (see with_mask); causal: the diagonal j <= i +
    offset."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    s = scores(q, k, scale, causal, offset)
    if attn_mask is not None:
        s = with_mask(s, attn_mask)
    b, h = q.shape[:2]
    t, bt = (head_params(p, b, h, s.dtype, s.device) for p in (tau, beta))
    w = along(s, t, bt, -1, ELASTIC)  # elastic_softmax's op, below the public API
    out = w @ v.to(s.dtype)
    # a query with no kept key gives 0 even where v holds NaN or inf (0 @ NaN is NaN)
    live = (s >= 0).any(-1, keepdim=True) | s.isnan().any(-1, keepdim=True)
    return torch.where(live, out, 0).to(q.dtype)



def hidden_keys(q: torch.Tensor, k: torch.Tensor, causal: bool,
                attn_mask: torch.Tensor | None, offset: int = 0) -> torch.Tensor | None:
    """Where a key does not exist for a query, broadcastable to (B, H, Lq, Lk): hidden by
    the causal mask (diagonal j <= i + offset), a bool mask's False or a float mask's -inf
    (None: every key takes part)."""
    hidden = None if not causal else ~visible(q.shape[2], k.shape[2], q.device,
                                              offset=offset)
    if attn_mask is None:
        return hidden
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    try:
        torch.broadcast_shapes(attn_mask.shape, shape)
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast "
                         f"against the scores {shape}") from None
    if attn_mask.dtype == torch.bool:
        m = ~attn_mask.to(q.device)
    elif attn_mask.is_floating_point():
        m = attn_mask.to(q.device) == -math.inf
    else:
        raise TypeError(f"attn_mask must be bool or floating point, got {attn_mask.dtype}")
    return m if hidden is None else m | hidden


def _normalize(a: torch.Tensor, offset: Scalar | None) -> torch.Tensor:
    """a / (offset + sum a) along the last dim for nonnegative a (NaN propagates): the limit,
    equal shares among the infinite terms, where some are +inf; 0 where the sum is 0."""
    big = a == math.inf
    inf_row = big.any(-1, keepdim=True) & ~a.isnan().any(-1, keepdim=True)
    finite = torch.where(inf_row, 0, a)  # keeps inf / inf (and its NaN gradient) out
    den = finite.sum(-1, keepdim=True)
    if offset is not None:
        den = den + offset
    w = torch.where(den != 0, finite / torch.where(den != 0, den, 1), 0)
    shares = big.to(a.dtype) / big.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(inf_row, shares, w)


def stablemax_weight(s: torch.Tensor) -> torch.Tensor:
    """st(s) = s + 1 for s >= 0, 1/(1 - s) below, differentiable twice: the branch not taken
    never sees the other's arguments (no 0 * inf in the gradient), and a NaN takes s + 1, so
    that its gradient is NaN too."""
    return torch.where(s < 0, 1 / (1 - s.clamp_max(0)), s + 1)


def cog_weights(s: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
    """Cog's weights sign(s) exp(|s| - m) / sum exp(|s'| - m) along the last dim (m the
    largest visible |s|, a constant to autograd: the weights do not depend on it), hidden
    keys out of every sum, differentiable twice with the derivative docs/attention.md
    section 9 gives at s = 0: the numerator sign(s) e^|s| jumps there, and its derivative
    is taken as e^|s| on both sides (the mean of the one-sided ones) by adding
    e^|s| (s - sign(s) |s|), which is 0 with derivative 1 exactly at s = 0. The limits: a
    NaN visible score makes the query's weights NaN; k visible scores of infinite |s| give
    sign(s)/k at each and 0 elsewhere; no visible key gives zeros."""
    if hidden is not None:  # 0 before any op: a hidden NaN or inf never reaches a gradient
        s = s.masked_fill(hidden, 0)
    big = s.abs() == math.inf
    nan_row = s.isnan().any(-1, keepdim=True)
    inf_row = big.any(-1, keepdim=True) & ~nan_row
    sf = torch.where(big | inf_row, 0, s)  # an infinite query's limit is a constant
    a = sf.abs()
    x = a if hidden is None else a.masked_fill(hidden, -math.inf)
    m = x.detach().amax(-1, keepdim=True).clamp_min(0)  # -inf (no visible key) -> 0
    e = torch.exp(x - m)
    sign = sf.sign()
    num = sign * e + e * (sf - sign * a)
    den = e.sum(-1, keepdim=True)
    w = torch.where(den != 0, num / torch.where(den != 0, den, 1), 0)  # NaN != 0
    shares = torch.where(big, s.sign(), 0) / big.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(inf_row, shares.to(w.dtype), w)


def attention_weights(weight: Weight, q: torch.Tensor, k: torch.Tensor, *, p_score: Scalar,
                      p_den: Scalar, scale: float, causal: bool,
                      attn_mask: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
    """The weights w (B, H, Lq, Lk), in q's working precision, of `weight` over the scores
    scale * q @ k^T: the keys a query does not see (causal with the diagonal j <= i +
    offset, attn_mask) do not exist for it (weight 0, outside every sum); a float mask is
    added to the scores. p_score and p_den as attention/weights.py names them: floats or
    tensors broadcasting against (B, H, 1, 1)."""
    weight = Weight(weight)
    wd = work_dtype(q.dtype)
    s = (q.to(wd) @ k.to(wd).transpose(-1, -2)) * scale
    if attn_mask is not None and attn_mask.is_floating_point():
        s = s + attn_mask.to(device=s.device, dtype=wd)
    hidden = hidden_keys(q, k, causal, attn_mask, offset)
    b, h = q.shape[:2]
    p_score, p_den = (head_params(p, b, h, wd, s.device) for p in (p_score, p_den))
    if weight is Weight.COG:
        return cog_weights(s, hidden)
    if weight.exponential:
        if hidden is not None:
            s = s.masked_fill(hidden, -math.inf)
        if weight is Weight.ELASTIC:
            return along(s, p_score, p_den, -1, ELASTIC)
        return along(s, SOFTMAX1.tau, SOFTMAX1.offset, -1, SOFTMAX1)
    if hidden is not None:  # 0 before any op: a hidden NaN or inf never reaches a gradient
        s = s.masked_fill(hidden, 0)
    if weight is Weight.SIGMOID:
        w = torch.sigmoid(s + p_score)
    elif weight is Weight.SYMAX:
        a = s.abs() if hidden is None else s.abs().masked_fill(hidden, 0)
        return _normalize(a, p_den)
    elif weight is Weight.STABLEMAX:
        a = stablemax_weight(s)
        return _normalize(a if hidden is None else a.masked_fill(hidden, 0), None)
    else:  # pragma: no cover - every Weight is handled above
        raise ValueError(f"no composite for weight {weight!r}")
    return w if hidden is None else w.masked_fill(hidden, 0)


def attention_composite(weight: Weight, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        *, p_score: Scalar, p_den: Scalar, scale: float, causal: bool,
                        attn_mask: torch.Tensor | None = None, offset: int = 0
                        ) -> torch.Tensor:
    """out = attention_weights(...) @ v in q's dtype, differentiable in q, k, v and tensor
    p_score, p_den; a query whose weights are all 0 (no visible key, or none kept) gives
    exactly 0 and zero gradients even where v holds NaN or inf."""
    w = attention_weights(weight, q, k, p_score=p_score, p_den=p_den, scale=scale,
                          causal=causal, attn_mask=attn_mask, offset=offset)
    out = w @ v.to(w.dtype)
    live = (w != 0).any(-1, keepdim=True) | w.isnan().any(-1, keepdim=True)
    if weight is Weight.COG:  # a zero score has weight 0 but a gradient: every visible key
        hidden = hidden_keys(q, k, causal, attn_mask, offset)
        sees = (k.shape[2] > 0) if hidden is None else (~hidden).any(-1, keepdim=True)
        live = live | sees
    return torch.where(live, out, 0).to(q.dtype)
