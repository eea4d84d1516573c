"""Queries with an infinite weight, off every kernel's hot path (docs/attention.md section 3).

An infinite weight wins outright: the query's weights are the limit, 1/k on each of its k
visible infinite weights and 0 elsewhere, so its output is the mean of those keys' values
and its gradients are zero except dv, which gets dO/k at each of them. The infinite weights
are the +inf scores for Elastic, softmax1 and stablemax, and the +inf and -inf ones for
symax (|-inf| is infinite too: docs/definitions.md section 3) and for Cog, whose limit is
signed: sign(s)/k on each of the k keys of infinite |s|, so its output is the mean of
sign(s_j) v_j over them and dv_j gets sign(s_j) dO/k; sigmoid's weights are at most 1 and
it has no such query. A flash kernel marks such a query by its statistics
(m = +inf; NaN wins over +inf) and leaves the rest to these two functions, which the native
and tiled torch kernels share (the Triton kernel finishes such queries in its own loop,
reading nothing back to the host: docs/attention.md section 7).
"""

from __future__ import annotations

import math

import torch

from .weights import Weight


def _infinite_scores(q: torch.Tensor, k: torch.Tensor, m: torch.Tensor, scale: float,
                     causal: bool, key_mask: torch.Tensor | None, weight: Weight | int,
                     offset: int = 0) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(indices (n, 3) of the queries marked m = +inf, their (n, length_k) float matrix of
    limit weights: 1/count at each infinite weight, signed for COG); causal: query i sees key
    j iff j <= i + offset."""
    # one reduction first: almost every call has no such query (NaN wins the max, and
    # then the marks are looked for); an empty m has none
    if m.numel() == 0 or float(m.max()) < math.inf:
        return None
    idx = (m == math.inf).nonzero()
    if idx.numel() == 0:
        return None
    b, h, i = idx.unbind(1)
    wd = m.dtype
    s = torch.einsum("nd,njd->nj", q[b, h, i].to(wd), k[b, h].to(wd)) * scale
    signed = Weight(weight) is Weight.COG
    hits = (s.abs() if signed or Weight(weight) is Weight.SYMAX else s) == math.inf
    if causal:
        hits &= torch.arange(k.shape[2], device=q.device)[None, :] <= i[:, None] + offset
    if key_mask is not None:  # (batch, length_k): padded keys do not exist for the query
        hits &= key_mask.to(device=s.device, dtype=torch.bool)[b]
    hits = hits.to(wd)
    share = hits / hits.sum(-1, keepdim=True)
    return idx, torch.where(hits != 0, share * s.sign(), 0) if signed else share


def fix_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                m: torch.Tensor, den: torch.Tensor, scale: float, causal: bool,
                key_mask: torch.Tensor | None = None,
                weight: Weight | int = Weight.ELASTIC, offset: int = 0,
                gate: torch.Tensor | None = None,
                ungated: torch.Tensor | None = None) -> None:
    """Overwrite out and den (in place) at the queries whose m is +inf (causal: with the
    diagonal j <= i + offset). With a gate ((batch, heads, length_q, value_dim)), out gets
    the limit times the gate and ungated, where given, the limit itself."""
    found = _infinite_scores(q, k, m, scale, causal, key_mask, weight, offset)
    if found is None:
        return
    idx, share = found
    b, h, i = idx.unbind(1)
    limit = torch.einsum("nj,njd->nd", share, v[b, h].to(share.dtype))
    if gate is not None:
        if ungated is not None:
            ungated[b, h, i] = limit.to(ungated.dtype)
        limit = limit * gate[b, h, i].to(limit.dtype)
    out[b, h, i] = limit.to(out.dtype)
    den[b, h, i] = 1 / share.abs().amax(-1)  # the number of infinite weights


def fix_backward(q: torch.Tensor, k: torch.Tensor, do: torch.Tensor, dv: torch.Tensor,
                 m: torch.Tensor, scale: float, causal: bool,
                 key_mask: torch.Tensor | None = None,
                 weight: Weight | int = Weight.ELASTIC, offset: int = 0) -> None:
    """Add the marked queries' dO / k to dv of their infinite-weight keys (in place, dv in
    work dtype); key_mask (batch, length_k) bool, True where a key takes part, as the
    kernels take it; causal with the diagonal j <= i + offset."""
    found = _infinite_scores(q, k, m, scale, causal, key_mask, weight, offset)
    if found is None:
        return
    idx, share = found
    b, h, i = idx.unbind(1)
    contrib = share[:, :, None] * do[b, h, i].to(share.dtype)[:, None, :]
    dv.index_put_((b, h), contrib, accumulate=True)


__all__ = ["fix_backward", "fix_forward"]
