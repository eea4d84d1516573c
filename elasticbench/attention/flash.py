"""Attention in tiles, in torch, for every weight of `weights.Weight`: O(length) memory.

One tiled forward and one backward, parameterized by the weight (the contract of
`weights`; docs/attention.md sections 2 and 9). Elastic's forward, for a block of queries,
over blocks of keys (docs/attention.md section 2):

    s     = scale * q @ k^T                 (causally hidden keys: -inf)
    m'    = max(m, max of kept s)           (m starts at 0: kept scores are >= 0, so this
                                             is the kept maximum, and 0 when nothing is kept)
    l     = l * exp((m - m')/tau) + sum_kept exp((s - m')/tau)
    acc   = acc * exp((m - m')/tau) + p @ v
    out   = acc / (l + beta * exp(-m/tau))  (0 where l = 0: no kept key)

softmax1 is the same loop with tau = beta = 1 and every finite visible score kept, and Cog
the same loop again on |s| (the running max of |s|, den = sum exp(|s| - m), no sink) with
each weight signed by sign(s) before the product with v. symax
and stablemax need no max: l = sum f(s) and acc = sum f(s) v over the visible keys, out =
acc / (eta + l) (stablemax: acc / l; 0 where that is 0); sigmoid has no normalizer, out =
sum sigmoid(s + bias) v. Each returns the row statistics m and den beside the output
(`weights`), from which the backward recomputes the weights y tile by tile:

    g = dO @ v^T,  c = rowsum(dO * out)
    exp family:  ds = y (g - c) / tau       symax, stablemax:  ds = f'(s) / den (g - c)
    Cog:         ds = p (g - sign(s) c), p = exp(|s| - m) / den, y = sign(s) p
    sigmoid:     ds = g y (1 - y)
    dv += y^T @ dO,  dk += scale ds^T @ q,  dq += scale ds @ k

and the parameters' gradients per (batch, head): Elastic's

    dtau  = sum_i ( -sum_j ds_ij (s_ij - m_i)/tau - c_i w_i m_i / tau^2 ),  w_i = beta e^{-m_i/tau} / den_i
    dbeta = sum_i -c_i e^{-m_i/tau} / den_i

symax's d eta = sum_i -c_i / den_i, sigmoid's d bias = sum_ij ds_ij; the rest have none
(their zero). p_score and p_den arrive as (batch, heads) tensors in the working precision, each
kernel takes an optional (batch, length_k) bool key_mask (True: the key takes part) applied
tile by tile, and queries with an infinite weight are finished by `special`. A gate
((batch, heads, length_q, value_dim), `weights`' contract) multiplies each query block's
output where it is normalized, beside the ungated block kept for the backward.
"""

from __future__ import annotations

import math

import torch

from . import special
from .operands import visible, work_dtype
from .weights import Weight

BLOCK_Q = 1024
BLOCK_K = 512
# The other weights' loops (fewer, in-place passes over each tile): 256 x 256 tiles of all
# heads at once stay nearer the cache; at B=2 H=4 L=1024 D=64 fp32 on one thread they ran
# forward+backward 10-30% faster than 1024 x 512 ones.
FAMILY_BLOCK_Q = 256
FAMILY_BLOCK_K = 256


def _key_end(q1: int, length_k: int, diag: int | None) -> int:
    """Keys past what the block's last query sees are hidden from all of it: causally
    (diag: the offset of the diagonal, key j visible to query i iff j <= i + diag; None: no
    causal mask) none from q1 + diag on."""
    return length_k if diag is None else min(length_k, max(0, q1 + diag))


def _scores(qb: torch.Tensor, kb: torch.Tensor, scale: float, diag: int | None, q0: int,
            k0: int, key_mask: torch.Tensor | None) -> torch.Tensor:
    """The tile's scores, keys hidden causally (diag: _key_end) or by key_mask (batch,
    length_k) at -inf."""
    s = (qb @ kb.transpose(-1, -2)) * scale
    if diag is not None and k0 + s.shape[-1] - 1 > q0 + diag:  # the tile crosses the diagonal
        s = s.masked_fill(~visible(s.shape[-2], s.shape[-1], s.device, q0, k0, diag),
                          -math.inf)
    if key_mask is not None:
        keep = key_mask[:, None, None, k0:k0 + s.shape[-1]].to(device=s.device, dtype=torch.bool)
        s = s.masked_fill(~keep, -math.inf)
    return s


def _tile(qb: torch.Tensor, kb: torch.Tensor, scale: float, diag: int | None, q0: int,
          k0: int, key_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The tile's raw scores (a fresh tensor the caller may overwrite) and which keys each
    query sees (None: all of them); the weights that are not exponentials need both, since
    symax gives -inf a weight."""
    s = (qb @ kb.transpose(-1, -2)).mul_(scale)
    vis = None
    if diag is not None and k0 + s.shape[-1] - 1 > q0 + diag:
        vis = visible(s.shape[-2], s.shape[-1], s.device, q0, k0, diag)
    if key_mask is not None:
        keep = key_mask[:, None, None, k0:k0 + s.shape[-1]].to(device=s.device, dtype=torch.bool)
        vis = keep if vis is None else vis & keep
    return s, vis


def _in_place(*tensors: torch.Tensor) -> bool:
    """Whether the family's loops may overwrite their tile temporaries in place: always,
    unless autograd records them (a caller differentiating through this code, as the
    verifier's second-order probe does), where the out-of-place forms keep its graph."""
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _op(ip: bool, x: torch.Tensor, name: str, *args) -> torch.Tensor:
    """x.name_(*args) when ip, else x.name(*args)."""
    return getattr(x, name + "_" if ip else name)(*args)


def _weigh(weight: Weight, s: torch.Tensor, bias: torch.Tensor | None,
           ip: bool) -> torch.Tensor:
    """f(s) elementwise (in s's storage when ip): |s| (symax), st(s) (stablemax),
    sigmoid(s + bias) (sigmoid)."""
    if weight is Weight.SYMAX:
        return _op(ip, s, "abs")
    if weight is Weight.STABLEMAX:  # st(s) = 1/(1 - min(s, 0)) + max(s, 0); NaN stays NaN
        below = torch.rsub(s.clamp_max(0), 1).reciprocal_()
        return _op(ip, _op(ip, s, "clamp_min", 0), "add", below)
    assert bias is not None
    return _op(ip, _op(ip, s, "add", bias), "sigmoid")


class _Outputs:
    """The forward's output in the work dtype, each query block stored once where it is
    normalized: times the gate where one is given, and then, with keep_ungated, also as it
    is (`weights`' contract)."""

    def __init__(self, q: torch.Tensor, dv: int, gate: torch.Tensor | None,
                 keep_ungated: bool):
        wd = work_dtype(q.dtype)
        self.out = torch.empty(*q.shape[:3], dv, dtype=wd, device=q.device)
        self.gate = gate
        self.keep = keep_ungated
        self.ungated = torch.empty_like(self.out) if gate is not None and keep_ungated else None

    def put(self, q0: int, q1: int, o: torch.Tensor) -> None:
        """Store query block [q0, q1)'s output o (work dtype)."""
        if self.gate is None:
            self.out[:, :, q0:q1] = o
            return
        if self.ungated is not None:
            self.ungated[:, :, q0:q1] = o
        torch.mul(o, self.gate[:, :, q0:q1], out=self.out[:, :, q0:q1])

    def finish(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor,
               den: torch.Tensor, scale: float, diag: int | None,
               key_mask: torch.Tensor | None, weight: Weight, special_queries: bool = True
               ) -> tuple[torch.Tensor, ...]:
        """special's queries finished (unless the weight has none), then (out, m, den) or,
        with keep_ungated, (out, m, den, ungated), the outputs in q's dtype."""
        if special_queries:
            special.fix_forward(q, k, v, self.out, m, den, scale, diag is not None, key_mask,
                                weight, offset=diag or 0, gate=self.gate,
                                ungated=self.ungated)
        out = self.out.to(q.dtype)
        if not self.keep:
            return out, m, den
        return out, m, den, (out if self.ungated is None else self.ungated.to(q.dtype))


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p_score: torch.Tensor,
            p_den: torch.Tensor, scale: float, causal: bool, key_mask: torch.Tensor | None = None,
            weight: Weight | int = Weight.ELASTIC, offset: int = 0,
            gate: torch.Tensor | None = None, keep_ungated: bool = False
            ) -> tuple[torch.Tensor, ...]:
    """(out in q's dtype, m, den) with m and den (batch, heads, length_q) in the work dtype;
    key_mask (batch, length_k) bool: the keys where it is False take no part; causal: query
    i sees key j iff j <= i + offset; gate, keep_ungated: `weights`' contract ((out, m, den,
    ungated) with keep_ungated)."""
    weight = Weight(weight)
    diag = offset if causal else None
    outs = _Outputs(q, v.shape[3], gate, keep_ungated)
    if weight in (Weight.SOFTMAX1, Weight.COG):
        return _forward_exp(q, k, v, scale, diag, key_mask, weight, outs)
    if not weight.exponential:
        return _forward_sums(q, k, v, p_score, p_den, scale, diag, key_mask, weight, outs)
    wd = work_dtype(q.dtype)
    bsz, heads, lq, _ = q.shape
    lk = k.shape[2]
    t3, b3 = p_score[..., None], p_den[..., None]
    t4 = t3[..., None]
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
        for k0 in range(0, _key_end(q1, lk, diag), BLOCK_K):
            k1 = min(lk, k0 + BLOCK_K)
            s = _scores(qb, k[:, :, k0:k1].to(wd), scale, diag, q0, k0, key_mask)
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
        outs.put(q0, q1, o.masked_fill(nan_row[..., None], math.nan))
        m_all[:, :, q0:q1] = torch.where(inf_row, math.inf, m).masked_fill(nan_row, math.nan)
        den_all[:, :, q0:q1] = den.masked_fill(nan_row, math.nan)
    return outs.finish(q, k, v, m_all, den_all, scale, diag, key_mask, weight)


def _exp_tile(weight: Weight, qb: torch.Tensor, kb: torch.Tensor, scale: float,
              diag: int | None, q0: int, k0: int, key_mask: torch.Tensor | None, ip: bool
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The exponent's argument x of the tile (a fresh tensor; hidden keys at -inf) and the
    weights' signs: softmax1's scores and None; Cog's |s| and sign(s) (0 at hidden keys,
    whose |s| is -inf whatever their score: a computed -inf score is |s| = +inf)."""
    if weight is Weight.SOFTMAX1:
        return _scores(qb, kb, scale, diag, q0, k0, key_mask), None
    s, vis = _tile(qb, kb, scale, diag, q0, k0, key_mask)
    sign = s.sign()
    x = _op(ip, s, "abs")
    if vis is not None:
        x = _op(ip, x, "masked_fill", ~vis, -math.inf)
        sign = _op(ip, sign, "masked_fill", ~vis, 0)
    return x, sign


def _forward_exp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                 diag: int | None, key_mask: torch.Tensor | None, weight: Weight,
                 outs: _Outputs) -> tuple[torch.Tensor, ...]:
    """softmax1 and Cog, one online-max loop over x = s (softmax1) or |s| (Cog): m = the
    running max of x floored at 0 (softmax1's 1 is exp(0); Cog's |s| >= 0, so m is 0 only
    when the query sees no key), l = sum exp(x - m), acc = sum y v with y = exp(x - m)
    (softmax1) or sign(s) exp(x - m) (Cog); den = l + exp(-m) (softmax1's 1) or l (Cog).
    The running max finds the special queries by itself: a NaN score makes m NaN for good,
    an infinite x makes it +inf (NaN then spreads through that query's sums, which special
    overwrites). No parameter."""
    wd = work_dtype(q.dtype)
    bsz, heads, lq, _ = q.shape
    lk = k.shape[2]
    ip = _in_place(q, k, v)
    cog = weight is Weight.COG
    m_all = torch.empty(bsz, heads, lq, dtype=wd, device=q.device)
    den_all = torch.empty_like(m_all)
    for q0 in range(0, lq, FAMILY_BLOCK_Q):
        q1 = min(lq, q0 + FAMILY_BLOCK_Q)
        qb = q[:, :, q0:q1].to(wd)
        m = torch.zeros(bsz, heads, q1 - q0, dtype=wd, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros(bsz, heads, q1 - q0, v.shape[3], dtype=wd, device=q.device)
        for k0 in range(0, _key_end(q1, lk, diag), FAMILY_BLOCK_K):
            k1 = min(lk, k0 + FAMILY_BLOCK_K)
            x, sign = _exp_tile(weight, qb, k[:, :, k0:k1].to(wd), scale, diag, q0, k0,
                                key_mask, ip)
            m_new = torch.maximum(m, x.amax(-1))
            alpha = torch.exp(m - m_new)
            p = _op(ip, x - m_new[..., None], "exp")
            l = l * alpha + p.sum(-1)  # noqa: E741
            y = p if sign is None else _op(ip, p, "mul", sign)
            acc = acc * alpha[..., None] + y @ v[:, :, k0:k1].to(wd)
            m = m_new
        nan_row = m.isnan()
        den = l if cog else l + torch.exp(-m)
        o = acc / den[..., None]
        if cog:  # no visible key: l = 0 and out exactly 0
            o = torch.where(den[..., None] == 0, 0, o)
        outs.put(q0, q1, o.masked_fill(nan_row[..., None], math.nan))
        m_all[:, :, q0:q1] = m
        den_all[:, :, q0:q1] = den.masked_fill(nan_row, math.nan)
    return outs.finish(q, k, v, m_all, den_all, scale, diag, key_mask, weight)


def _forward_sums(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p_score: torch.Tensor,
                  p_den: torch.Tensor, scale: float, diag: int | None,
                  key_mask: torch.Tensor | None, weight: Weight, outs: _Outputs
                  ) -> tuple[torch.Tensor, ...]:
    """symax, stablemax (plain running sums, no max) and sigmoid (no normalizer). The
    weights are >= 0, so a query's sum l is NaN exactly when one of its weights is, and
    +inf when one is infinite (or the sum overflows, which special then refuses: NaN)."""
    wd = work_dtype(q.dtype)
    bsz, heads, lq, _ = q.shape
    lk, dv = k.shape[2], v.shape[3]
    sigmoid = weight is Weight.SIGMOID
    ip = _in_place(q, k, v, p_score, p_den)
    bias = p_score[..., None, None] if sigmoid else None
    m_all = torch.zeros(bsz, heads, lq, dtype=wd, device=q.device)
    den_all = torch.ones_like(m_all)
    for q0 in range(0, lq, FAMILY_BLOCK_Q):
        q1 = min(lq, q0 + FAMILY_BLOCK_Q)
        qb = q[:, :, q0:q1].to(wd)
        acc = torch.zeros(bsz, heads, q1 - q0, dv + (not sigmoid), dtype=wd, device=q.device)
        for k0 in range(0, _key_end(q1, lk, diag), FAMILY_BLOCK_K):
            k1 = min(lk, k0 + FAMILY_BLOCK_K)
            s, vis = _tile(qb, k[:, :, k0:k1].to(wd), scale, diag, q0, k0, key_mask)
            f = _weigh(weight, s, bias, ip)
            if vis is not None:  # hidden keys (a NaN there included) do not exist
                f = _op(ip, f, "masked_fill", ~vis, 0)
            vb = v[:, :, k0:k1].to(wd)
            if not sigmoid:  # a column of ones: the GEMM sums the weights too
                vb = torch.cat((vb, torch.ones_like(vb[..., :1])), -1)
            acc += f @ vb
        if sigmoid:  # each weight on its own: a NaN score reaches out through its product
            outs.put(q0, q1, acc)
            continue
        l = acc[..., dv]  # noqa: E741
        nan_row, inf_row = l.isnan(), l == math.inf
        den = p_den[..., None] + l if weight is Weight.SYMAX else l
        o = torch.where(den[..., None] == 0, 0, acc[..., :dv] / den[..., None])  # 0/0 is 0
        outs.put(q0, q1, o.masked_fill(nan_row[..., None], math.nan))
        m_all[:, :, q0:q1] = torch.zeros_like(l).masked_fill(inf_row, math.inf).masked_fill(
            nan_row, math.nan)
        den_all[:, :, q0:q1] = den.masked_fill(nan_row, math.nan)
    return outs.finish(q, k, v, m_all, den_all, scale, diag, key_mask, weight,
                       special_queries=not sigmoid)


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             do: torch.Tensor, m: torch.Tensor, den: torch.Tensor, p_score: torch.Tensor,
             p_den: torch.Tensor, scale: float, causal: bool, key_mask: torch.Tensor | None = None,
             weight: Weight | int = Weight.ELASTIC, offset: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in q's dtype and (dp_score, dp_den) per (batch, head) in the work dtype; causal
    with the diagonal of forward's offset."""
    weight = Weight(weight)
    diag = offset if causal else None
    if weight in (Weight.SOFTMAX1, Weight.COG):
        return _backward_exp(q, k, v, out, do, m, den, p_score, p_den, scale, diag, key_mask,
                             weight)
    if not weight.exponential:
        return _backward_sums(q, k, v, out, do, m, den, p_score, p_den, scale, diag, key_mask,
                              weight)
    wd = work_dtype(q.dtype)
    lq, lk = q.shape[2], k.shape[2]
    t4 = p_score[..., None, None]
    m, den, inf_row, nan_row, r, c, dq, dk, dv = _backward_start(q, k, v, out, do, m, den)
    m0 = torch.where(inf_row, 0, m)  # +inf queries are left to special.fix_backward
    dsz = torch.zeros(q.shape[:2], dtype=wd, device=q.device)  # sum ds z
    for q0 in range(0, lq, BLOCK_Q):
        q1 = min(lq, q0 + BLOCK_Q)
        qb, dob = q[:, :, q0:q1].to(wd), do[:, :, q0:q1].to(wd)
        mb, rb, cb = m0[:, :, q0:q1, None], r[:, :, q0:q1, None], c[:, :, q0:q1, None]
        # a NaN query's weights are all NaN (its gradients must show it); +inf ones are skipped
        rows = nan_row[:, :, q0:q1, None]
        skip = inf_row[:, :, q0:q1, None]
        for k0 in range(0, _key_end(q1, lk, diag), BLOCK_K):
            k1 = min(lk, k0 + BLOCK_K)
            kb, vb = k[:, :, k0:k1].to(wd), v[:, :, k0:k1].to(wd)
            s = _scores(qb, kb, scale, diag, q0, k0, key_mask)
            dp = dob @ vb.transpose(-1, -2)
            keep = ((s >= 0) | (rows & (s != -math.inf))) & ~skip
            z = torch.where(keep, (s - mb) / t4, 0)
            p = torch.where(keep, torch.exp(z) * rb, 0)
            # (dp - c)/tau before the product: a subnormal p (dp - c) is never scaled by 1/tau
            ds = torch.where(keep, p * ((dp - cb) / t4), 0)
            dsz += (ds * z).sum((-1, -2))
            dv[:, :, k0:k1] += p.transpose(-1, -2) @ dob
            dk[:, :, k0:k1] += (ds.transpose(-1, -2) @ qb) * scale
            dq[:, :, q0:q1] += (ds @ kb) * scale
    dp_score, dp_den = param_grads(dsz, c, m, den, p_score, p_den)
    special.fix_backward(q, k, do, dv, m, scale, diag is not None, key_mask,
                         offset=diag or 0)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dp_score, dp_den


def _backward_exp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  do: torch.Tensor, m: torch.Tensor, den: torch.Tensor, p_score: torch.Tensor,
                  p_den: torch.Tensor, scale: float, diag: int | None,
                  key_mask: torch.Tensor | None, weight: Weight
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor]:
    """softmax1 and Cog from _forward_exp's statistics: p = exp(x - m) / den; softmax1's
    y = p, ds = p (g - c); Cog's y = sign(s) p, ds = p (g - sign(s) c) (docs/attention.md
    section 9: at s = 0 the mean of the two one-sided derivatives, p g). No parameter (zero
    gradients). The visible-key masks are applied only in the query blocks that hold a NaN
    or +inf query."""
    wd = work_dtype(q.dtype)
    ip = _in_place(q, k, v, out, do, m, den, p_score, p_den)
    lq, lk = q.shape[2], k.shape[2]
    m, den, inf_row, nan_row, r, c, dq, dk, dv = _backward_start(q, k, v, out, do, m, den)
    m0 = torch.where(inf_row, 0, m)  # +inf queries are left to special.fix_backward
    for q0 in range(0, lq, FAMILY_BLOCK_Q):
        q1 = min(lq, q0 + FAMILY_BLOCK_Q)
        qb, dob = q[:, :, q0:q1].to(wd), do[:, :, q0:q1].to(wd)
        mb, rb, cb = m0[:, :, q0:q1, None], r[:, :, q0:q1, None], c[:, :, q0:q1, None]
        skip = inf_row[:, :, q0:q1, None]
        special_rows = bool((skip | nan_row[:, :, q0:q1, None]).any())
        for k0 in range(0, _key_end(q1, lk, diag), FAMILY_BLOCK_K):
            k1 = min(lk, k0 + FAMILY_BLOCK_K)
            kb, vb = k[:, :, k0:k1].to(wd), v[:, :, k0:k1].to(wd)
            x, sign = _exp_tile(weight, qb, kb, scale, diag, q0, k0, key_mask, ip)
            keep = (x != -math.inf) & ~skip if special_rows else None
            p = _op(ip, _op(ip, _op(ip, x, "sub", mb), "exp"), "mul", rb)  # hidden: exp(-inf) = 0
            g = dob @ vb.transpose(-1, -2)
            if sign is None:
                ds, y = _op(ip, _op(ip, g, "sub", cb), "mul", p), p
            else:
                ds = _op(ip, _op(ip, g, "sub", sign * cb), "mul", p)
                y = _op(ip, p, "mul", sign)
            if keep is not None:  # a NaN query's visible keys only; +inf ones are special's
                y, ds = _op(ip, y, "masked_fill", ~keep, 0), _op(ip, ds, "masked_fill", ~keep, 0)
            dv[:, :, k0:k1] += y.transpose(-1, -2) @ dob
            dk[:, :, k0:k1] += (ds.transpose(-1, -2) @ qb) * scale
            dq[:, :, q0:q1] += (ds @ kb) * scale
    special.fix_backward(q, k, do, dv, m, scale, diag is not None, key_mask, weight,
                         offset=diag or 0)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), torch.zeros_like(p_score), \
        torch.zeros_like(p_den)


def _backward_sums(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   do: torch.Tensor, m: torch.Tensor, den: torch.Tensor, p_score: torch.Tensor,
                   p_den: torch.Tensor, scale: float, diag: int | None,
                   key_mask: torch.Tensor | None, weight: Weight
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                              torch.Tensor]:
    """symax and stablemax (ds = f'(s)/den (g - c)), sigmoid (ds = g y (1 - y))."""
    wd = work_dtype(q.dtype)
    lq, lk = q.shape[2], k.shape[2]
    sigmoid = weight is Weight.SIGMOID
    ip = _in_place(q, k, v, out, do, m, den, p_score, p_den)
    bias = p_score[..., None, None] if sigmoid else None
    m, den, inf_row, _, r, c, dq, dk, dv = _backward_start(q, k, v, out, do, m, den)
    r = r.masked_fill(inf_row, 0)  # NaN rows stay NaN
    dbias = torch.zeros(q.shape[:2], dtype=wd, device=q.device)
    for q0 in range(0, lq, FAMILY_BLOCK_Q):
        q1 = min(lq, q0 + FAMILY_BLOCK_Q)
        qb, dob = q[:, :, q0:q1].to(wd), do[:, :, q0:q1].to(wd)
        rb, cb = r[:, :, q0:q1, None], c[:, :, q0:q1, None]
        skip = inf_row[:, :, q0:q1, None]
        skipping = not sigmoid and bool(skip.any())
        for k0 in range(0, _key_end(q1, lk, diag), FAMILY_BLOCK_K):
            k1 = min(lk, k0 + FAMILY_BLOCK_K)
            kb, vb = k[:, :, k0:k1].to(wd), v[:, :, k0:k1].to(wd)
            s, vis = _tile(qb, kb, scale, diag, q0, k0, key_mask)
            if skipping:  # an infinite weight's query is special's: keep its s finite
                s.masked_fill_(skip, 0)
            if weight is Weight.SYMAX:
                slope = torch.sign(s)  # 0 at 0, as abs's subgradient
                f = _weigh(weight, s, None, ip)
            elif weight is Weight.STABLEMAX:
                f = _weigh(weight, s, None, ip)
                # 1 on the right (f >= 1), 1/(1 - s)^2 = f^2 on the left (f < 1)
                slope = f.clamp_max(1).square_()
            else:
                f = _weigh(weight, s, bias, ip)
                slope = f * (1 - f)
            g = dob @ vb.transpose(-1, -2)
            if sigmoid:
                y, ds = f, _op(ip, g, "mul", slope)
            else:
                y = _op(ip, f, "mul", rb)
                ds = _op(ip, _op(ip, g.sub_(cb), "mul", rb), "mul", slope)
            if vis is not None:
                y, ds = _op(ip, y, "masked_fill", ~vis, 0), _op(ip, ds, "masked_fill", ~vis, 0)
            dv[:, :, k0:k1] += y.transpose(-1, -2) @ dob
            dk[:, :, k0:k1] += (ds.transpose(-1, -2) @ qb) * scale
            dq[:, :, q0:q1] += (ds @ kb) * scale
            if sigmoid:
                dbias += ds.sum((-1, -2))
    dp_score, dp_den = torch.zeros_like(p_score), torch.zeros_like(p_den)
    if sigmoid:
        dp_score = dbias
    elif weight is Weight.SYMAX:
        dp_den = -torch.where(inf_row, 0, c * r).sum(-1)
    if not sigmoid:
        special.fix_backward(q, k, do, dv, m, scale, diag is not None, key_mask, weight,
                             offset=diag or 0)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dp_score, dp_den


def _backward_start(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    do: torch.Tensor, m: torch.Tensor, den: torch.Tensor
                    ) -> tuple[torch.Tensor, ...]:
    """What every tiled backward starts from, in q's work dtype: (m, den, the queries whose
    m is +inf (special's), those whose m is NaN, r = 1/den (0 where den is 0), c = rowsum(dO
    out), and dq, dk, dv zeroed)."""
    wd = work_dtype(q.dtype)
    m, den = m.to(wd), den.to(wd)
    r = torch.where(den == 0, 0, 1 / den)
    c = (do.to(wd) * out.to(wd)).sum(-1)
    dq, dk, dv = (torch.zeros(t.shape, dtype=wd, device=q.device) for t in (q, k, v))
    return m, den, m == math.inf, m.isnan(), r, c, dq, dk, dv


def param_grads(dsz: torch.Tensor, c: torch.Tensor, m: torch.Tensor, den: torch.Tensor,
                tau: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Elastic's (dtau, dbeta) per (batch, head) from sum ds z over each (batch, head),
    c = rowsum(dO out) and the forward's statistics m, den per query (the module doc's
    formulas); a +inf query adds nothing (its output does not move), a NaN one NaN. Every
    kernel's Elastic backward ends here, on the device."""
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
