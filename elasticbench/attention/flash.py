"""Elastic attention in tiles, in torch: online max and sum over kept scores, O(length) memory.

Forward, for a block of queries, over blocks of keys (docs/attention.md section 2):

    s     = scale * q @ k^T                 (causally hidden keys: -inf)
    m'    = max(m, max of kept s)           (m starts at 0: kept scores are >= 0, so this
                                             is the kept maximum, and 0 when nothing is kept)
    l     = l * exp((m - m')/tau) + sum_kept exp((s - m')/tau)
    acc   = acc * exp((m - m')/tau) + p @ v
    out   = acc / (l + beta * exp(-m/tau))  (0 where l = 0: no kept key)

It returns the row statistics m and den = l + beta exp(-m/tau) beside the output; the
backward recomputes the weights p = exp((s - m)/tau) / den from them tile by tile:

    dp = dO @ v^T,  c = rowsum(dO * out),  ds = p (dp - c) / tau   (kept only)
    dv += p^T @ dO,  dk += scale ds^T @ q,  dq += scale ds @ k
    dtau  = sum_i ( -sum_j ds_ij (s_ij - m_i)/tau - c_i w_i m_i / tau^2 ),  w_i = beta e^{-m_i/tau} / den_i
    dbeta = sum_i -c_i e^{-m_i/tau} / den_i

tau and beta arrive as (batch, heads) tensors in the working precision. This is the same
contract as the native and Triton kernels: forward(q, k, v, tau, beta, scale, causal) ->
(out, m, den) and backward(q, k, v, out, dO, m, den, tau, beta, scale, causal) ->
(dq, dk, dv, dtau, dbeta) with dtau and dbeta per (batch, head), each taking an optional
(batch, length_k) bool key_mask (True: the key takes part) applied tile by tile.
"""

from __future__ import annotations

import math

import torch

from . import special
from .layout import visible, work_dtype

BLOCK_Q = 1024
BLOCK_K = 512


def _key_end(q1: int, length_k: int, causal: bool) -> int:
    """Keys past the last query of the block are hidden from all of it (causal)."""
    return min(length_k, q1) if causal else length_k


def _scores(qb: torch.Tensor, kb: torch.Tensor, scale: float, causal: bool, q0: int,
            k0: int, key_mask: torch.Tensor | None) -> torch.Tensor:
    """The tile's scores, keys hidden causally or by key_mask (batch, length_k) at -inf."""
    s = (qb @ kb.transpose(-1, -2)) * scale
    if causal and k0 + s.shape[-1] - 1 > q0:  # the tile crosses the diagonal
        s = s.masked_fill(~visible(s.shape[-2], s.shape[-1], s.device, q0, k0), -math.inf)
    if key_mask is not None:
        keep = key_mask[:, None, None, k0:k0 + s.shape[-1]].to(device=s.device, dtype=torch.bool)
        s = s.masked_fill(~keep, -math.inf)
    return s


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
            beta: torch.Tensor, scale: float, causal: bool, key_mask: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out in q's dtype, m, den) with m and den (batch, heads, length_q) in the work dtype;
    key_mask (batch, length_k) bool: the keys where it is False take no part."""
    wd = work_dtype(q.dtype)
    bsz, heads, lq, _ = q.shape
    lk = k.shape[2]
    t3, b3 = tau[..., None], beta[..., None]
    t4 = t3[..., None]
    out = torch.empty(bsz, heads, lq, v.shape[3], dtype=wd, device=q.device)
    m_all = torch.empty(bsz, heads, lq, dtype=wd, device=q.device)
    den_all = torch.empty_like(m_all)
    for q0 in range(0, lq, BLOCK_Q):
        q1 = min(lq, q0 + BLOCK_Q)
        qb = q[:, :, q0:q1].to(wd)
        m = torch.zeros(bsz, heads, q1 - q0, dtype=wd, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros(bsz, heads, q1 - q0, v.shape[3], dtype=wd, device=q.device)
        nan_row = torch.zeros_like(m, dtype=torch.bool)
        inf_row = torch.zeros_like(nan_row)
        for k0 in range(0, _key_end(q1, lk, causal), BLOCK_K):
            k1 = min(lk, k0 + BLOCK_K)
            s = _scores(qb, k[:, :, k0:k1].to(wd), scale, causal, q0, k0, key_mask)
            nan_row |= s.isnan().any(-1)
            inf_row |= (s == math.inf).any(-1)
            s = s.masked_fill(~((s >= 0) & (s < math.inf)), -math.inf)  # kept, finite
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.exp((m - m_new) / t3)
            p = torch.exp((s - m_new[..., None]) / t4)
            l = l * alpha + p.sum(-1)  # noqa: E741
            acc = acc * alpha[..., None] + p @ v[:, :, k0:k1].to(wd)
            m = m_new
        den = l + b3 * torch.exp(-m / t3)
        o = torch.where(l[..., None] > 0, acc / den[..., None], 0)
        out[:, :, q0:q1] = o.masked_fill(nan_row[..., None], math.nan)
        m_all[:, :, q0:q1] = torch.where(inf_row, math.inf, m).masked_fill(nan_row, math.nan)
        den_all[:, :, q0:q1] = den.masked_fill(nan_row, math.nan)
    special.fix_forward(q, k, v, out, m_all, den_all, scale, causal, key_mask)
    return out.to(q.dtype), m_all, den_all


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             do: torch.Tensor, m: torch.Tensor, den: torch.Tensor, tau: torch.Tensor,
             beta: torch.Tensor, scale: float, causal: bool, key_mask: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in q's dtype and (dtau, dbeta) per (batch, head) in the work dtype."""
    wd = work_dtype(q.dtype)
    lq, lk = q.shape[2], k.shape[2]
    t4 = tau[..., None, None]
    m, den = m.to(wd), den.to(wd)
    inf_row = m == math.inf
    nan_row = m.isnan()
    m0 = torch.where(inf_row, 0, m)  # +inf queries are left to special.fix_backward
    r = torch.where(den == 0, 0, 1 / den)
    c = (do.to(wd) * out.to(wd)).sum(-1)
    dq = torch.zeros(q.shape, dtype=wd, device=q.device)
    dk = torch.zeros(k.shape, dtype=wd, device=q.device)
    dv = torch.zeros(v.shape, dtype=wd, device=q.device)
    dsz = torch.zeros(q.shape[:2], dtype=wd, device=q.device)  # sum ds z
    for q0 in range(0, lq, BLOCK_Q):
        q1 = min(lq, q0 + BLOCK_Q)
        qb, dob = q[:, :, q0:q1].to(wd), do[:, :, q0:q1].to(wd)
        mb, rb, cb = m0[:, :, q0:q1, None], r[:, :, q0:q1, None], c[:, :, q0:q1, None]
        # a NaN query's weights are all NaN (its gradients must show it); +inf ones are skipped
        rows = nan_row[:, :, q0:q1, None]
        skip = inf_row[:, :, q0:q1, None]
        for k0 in range(0, _key_end(q1, lk, causal), BLOCK_K):
            k1 = min(lk, k0 + BLOCK_K)
            kb, vb = k[:, :, k0:k1].to(wd), v[:, :, k0:k1].to(wd)
            s = _scores(qb, kb, scale, causal, q0, k0, key_mask)
            keep = ((s >= 0) | (rows & (s != -math.inf))) & ~skip
            z = torch.where(keep, (s - mb) / t4, 0)
            p = torch.where(keep, torch.exp(z) * rb, 0)
            dp = dob @ vb.transpose(-1, -2)
            # (dp - c)/tau before the product: a subnormal p (dp - c) is never scaled by 1/tau
            ds = torch.where(keep, p * ((dp - cb) / t4), 0)
            dv[:, :, k0:k1] += p.transpose(-1, -2) @ dob
            dk[:, :, k0:k1] += (ds.transpose(-1, -2) @ qb) * scale
            dq[:, :, q0:q1] += (ds @ kb) * scale
            dsz += (ds * z).sum((-1, -2))
    dtau, dbeta = param_grads(dsz, c, m, den, tau, beta)
    special.fix_backward(q, k, do, dv, m, scale, causal, key_mask)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dtau, dbeta


def param_grads(dsz: torch.Tensor, c: torch.Tensor, m: torch.Tensor, den: torch.Tensor,
                tau: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dtau, dbeta) per (batch, head) from sum ds z over each (batch, head), c = rowsum(dO
    out) and the forward's statistics m, den per query (the module doc's formulas); a +inf
    query adds nothing (its output does not move), a NaN one NaN. Every kernel's backward
    ends here, on the device."""
    t3, b3 = tau[..., None], beta[..., None]
    inf_row = m == math.inf
    m0 = torch.where(inf_row, 0, m)
    r = torch.where(den == 0, 0, 1 / den)
    e = torch.exp(-m0 / t3)
    w = b3 * e * r
    wm = torch.where(w != 0, w * (m0 / t3), 0)  # w underflows long before m/tau overflows
    dtau = -dsz - torch.where(inf_row, 0, c * wm / t3).sum(-1)
    dbeta = -torch.where(inf_row, 0, c * e * r).sum(-1)
    return dtau, dbeta
