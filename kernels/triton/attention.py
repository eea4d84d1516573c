"""Elastic attention in Triton, forward and backward: the tiled design of docs/attention.md
section 2.

One program takes BLOCK_M queries of one (batch, head) and visits blocks of BLOCK_N keys,
keeping per query a running kept maximum m (from 0), a running sum l and an accumulator:

    s    = scale * q @ k^T               (causally hidden keys out of the mask)
    m'   = max(m, max of kept s)         (kept: s >= 0 and visible; NaN-propagating)
    l    = l 2^((m - m') k) + sum_kept 2^((s - m') k)           k = log2(e) / tau
    acc  = acc 2^((m - m') k) + p @ v
    out  = acc / (l + beta 2^(-m k))     (exactly 0 where l = 0: nothing kept, any beta)

Scores, sums and the accumulator are fp32. fp32 inputs multiply in IEEE fp32 (not TF32);
fp16 and bf16 inputs multiply in their own format with fp32 accumulation (their products are
exact), and p is rounded once to that format for p @ v, as flash kernels do (the budget's
l term, docs/attention.md section 5). Special queries need no pass of their own and nothing
read back to the host: a NaN among a query's visible scores makes its m, and so everything
it computes, NaN; a +inf score makes m = +inf, where each +inf score weighs 1 and every
finite one 0, so the same loop leaves the mean of those keys' values in out and their count
in den (docs/attention.md section 3); the backward gives such a query's dO/count to the dv of
its +inf keys and nothing else. Causal key blocks past the query block's last query are not
visited.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from elasticbench.attention.flash import param_grads

from .exp_family import exp2
from .launch import run
from .memory import max_nan

LOG2E = tl.constexpr(1.4426950408889634)  # a kernel may read only constexpr globals


@triton.jit
def _tile(base, width, offs_r, ok_r, offs_c):
    """Pointers and mask of rows offs_r (where ok_r) and columns offs_c (< width) of a
    row-major matrix of `width` columns at base."""
    return (base + offs_r[:, None] * width + offs_c[None, :],
            ok_r[:, None] & (offs_c[None, :] < width))


@triton.jit
def _tile_t(base, width, offs_r, ok_r, offs_c):
    """_tile's transpose: the same elements, indexed (column, row)."""
    return (base + offs_r[None, :] * width + offs_c[:, None],
            ok_r[None, :] & (offs_c[:, None] < width))


@triton.jit
def _keys(keep_ptr, bh, heads, lk, offs_n, col_ok, HAS_MASK: tl.constexpr):
    """The columns offs_n that take part (in range, and kept by the (batch, length_k)
    key-padding mask where there is one)."""
    if HAS_MASK:
        keep = tl.load(keep_ptr + (bh // heads) * lk + offs_n, mask=col_ok, other=0)
        col_ok = col_ok & (keep != 0)
    return col_ok


@triton.jit
def _key_end(kend_ptr, bh, heads, lk, q_end, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    """One past the last key a query block ending at q_end visits: causally no key past its
    last query, and none after the batch's last kept key (key padding)."""
    end = lk
    if CAUSAL:
        end = tl.minimum(lk, q_end)
    if HAS_MASK:
        end = tl.minimum(end, tl.load(kend_ptr + bh // heads))
    return end


@triton.jit
def _query_stats(m_ptr, r_ptr, c_ptr, at, row_ok):
    """A query block's forward statistics and c: (m with non-finite rows set to 0, r, c,
    the NaN rows, the +inf rows)."""
    m = tl.load(m_ptr + at, mask=row_ok, other=0.0)
    r = tl.load(r_ptr + at, mask=row_ok, other=0.0)
    c = tl.load(c_ptr + at, mask=row_ok, other=0.0)
    nan_q = m != m
    inf_q = m == float("inf")
    return tl.where(inf_q | nan_q, 0.0, m), r, c, nan_q, inf_q


@triton.jit
def attention_forward_kernel(
    q_ptr, k_ptr, v_ptr, tau_ptr, beta_ptr, out_ptr, m_ptr, den_ptr, keep_ptr, kend_ptr,
    lq, lk, d, dv, scale, heads,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr, HAS_MASK: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < lq
    q = tl.load(*_tile(q_ptr + bh * lq * d, d, offs_m, row_ok, offs_d), other=0.0)
    tau = tl.load(tau_ptr + bh)
    beta = tl.load(beta_ptr + bh)
    kk = LOG2E / tau
    m = tl.zeros([BLOCK_M], dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)  # noqa: E741
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    end = _key_end(kend_ptr, bh, heads, lk, (pid_m + 1) * BLOCK_M, CAUSAL, HAS_MASK)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        col_ok = _keys(keep_ptr, bh, heads, lk, offs_n, offs_n < lk, HAS_MASK)
        kt = tl.load(*_tile_t(k_ptr + bh * lk * d, d, offs_n, col_ok, offs_d), other=0.0)
        if IEEE:  # noqa: SIM108 (a constexpr branch: the compiler keeps one side)
            s = tl.dot(q, kt, input_precision="ieee") * scale
        else:
            s = tl.dot(q, kt) * scale
        visible = col_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None])
        kept = visible & (s >= 0.0)  # +inf kept too; NaN flags the query through the max
        top = max_nan(tl.where(visible & ((s >= 0.0) | (s != s)), s, 0.0), 1)
        m_new = tl.maximum(m, top, propagate_nan=tl.PropagateNan.ALL)
        # m = m_new = +inf: the running sums are the +inf scores' count and values (weight 1
        # each, every finite score 0), so out is their mean and den their count
        alpha = exp2(tl.where(m == m_new, 0.0, (m - m_new) * kk), True, -1)
        p = exp2(tl.where(kept, tl.where(s == m_new[:, None], 0.0, (s - m_new[:, None]) * kk),
                          float("-inf")), True, -1)
        l = l * alpha + tl.sum(p, axis=1)  # noqa: E741
        v = tl.load(*_tile(v_ptr + bh * lk * dv, dv, offs_n, col_ok, offs_e), other=0.0)
        if IEEE:  # noqa: SIM108
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    den = l + beta * exp2(-m * kk, True, -1)  # m = +inf: the count; m NaN: NaN
    live = (l > 0.0) | (l != l)
    out = tl.where(live[:, None], acc / tl.where(live, den, 1.0)[:, None], 0.0)
    out_at, out_ok = _tile(out_ptr + bh * lq * dv, dv, offs_m, row_ok, offs_e)
    tl.store(out_at, out.to(out_ptr.dtype.element_ty), mask=out_ok)
    tl.store(m_ptr + bh * lq + offs_m, m, mask=row_ok)
    tl.store(den_ptr + bh * lq + offs_m, den, mask=row_ok)


@dataclass(frozen=True)
class Tiles:
    """A launch's tiles: queries and keys per block, warps per program, pipeline stages."""

    block_m: int
    block_n: int
    warps: int
    stages: int


def tiles(dtype: torch.dtype, backward: bool = False) -> Tiles:
    """fp16 and bf16: 64 x 64 tiles, where Hopper's warpgroup MMA (wgmma) takes the dots (it
    needs num_warps % 4 == 0 and each dot's M a multiple of 64; 32-row tiles fall back to
    mma.sync): the forward on 4 warps and 3 stages (twice the 32 x 32 tiles' speed on an
    H100), the backward on 8 warps and 2 stages, where its dk and dv accumulators fit the
    registers (docs/attention.md section 7). fp32 multiplies in IEEE fp32 on the CUDA cores,
    which no tensor core instruction takes: 32 x 32 keeps its tiles in registers."""
    if dtype in (torch.float16, torch.bfloat16):
        return Tiles(64, 64, 8, 2) if backward else Tiles(64, 64, 4, 3)
    return Tiles(32, 32, 4, 3)


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))


def _key_mask(key_mask: torch.Tensor | None, batch: int, lk: int, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' key-padding operands: (batch, length_k) int8 keep flags and, per batch,
    one past the last kept key (int32); placeholders when there is no mask."""
    if key_mask is None:
        dummy = torch.zeros(1, dtype=torch.int32, device=device)
        return dummy.to(torch.int8), dummy
    keep = key_mask.to(device=device, dtype=torch.bool).reshape(batch, lk)
    last = torch.where(keep, torch.arange(1, lk + 1, device=device), 0).amax(-1)
    return keep.to(torch.int8).contiguous(), last.to(torch.int32).contiguous()


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
                      beta: torch.Tensor, scale: float, causal: bool,
                      key_mask: torch.Tensor | None = None, tile: Tiles | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out in q's dtype, m, den) with m and den (batch, heads, length_q) in fp32; q, k, v
    (batch, heads, length, dim) in fp32, fp16 or bf16; tau, beta (batch, heads); key_mask
    (batch, length_k) bool, True where a key takes part, or None."""
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"the triton attention kernel takes fp32, fp16 or bf16, not {q.dtype}")
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[3]
    qc, kc, vc = (t.contiguous() for t in (q, k, v))
    tau32 = tau.to(torch.float32).contiguous()
    beta32 = beta.to(torch.float32).contiguous()
    out = torch.empty(b, h, lq, dv, dtype=q.dtype, device=q.device)
    m = torch.empty(b, h, lq, dtype=torch.float32, device=q.device)
    den = torch.empty_like(m)
    t = tile or tiles(q.dtype)
    grid = (triton.cdiv(lq, t.block_m), b * h)
    keep, kend = _key_mask(key_mask, b, lk, q.device)
    run(attention_forward_kernel, grid,
        (qc, kc, vc, tau32, beta32, out, m, den, keep, kend, lq, lk, d, dv, float(scale), h),
        t.warps, {"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "BLOCK_D": _pow2(d),
            "BLOCK_DV": _pow2(dv), "CAUSAL": bool(causal), "IEEE": q.dtype == torch.float32,
            "HAS_MASK": key_mask is not None}, t.stages)
    return out, m, den


@triton.jit
def _recompute(q, kt, m, r, nan_q, inf_q, offs_m, offs_n, row_ok, col_ok, scale, kk, tau,
               CAUSAL: tl.constexpr, IEEE: tl.constexpr):
    """The tile's kept mask, its z = (s - m)/tau and its weights p = 2^((s - m) k) / den,
    from the forward's statistics (a NaN query keeps every visible key: its p is NaN)."""
    if IEEE:  # noqa: SIM108
        s = tl.dot(q, kt, input_precision="ieee") * scale
    else:
        s = tl.dot(q, kt) * scale
    visible = row_ok[:, None] & col_ok[None, :]
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None])
    keep = visible & ((s >= 0.0) | nan_q[:, None]) & (~inf_q[:, None])
    d = tl.where(keep, s - m[:, None], 0.0)
    p = tl.where(keep, exp2(tl.where(keep, d * kk, float("-inf")), True, -1) * r[:, None], 0.0)
    # a +inf query weighs its +inf scores 1/count each (r = 1/den, den the count): only dv
    # sees them, as its other gradients are 0
    p_dv = tl.where(inf_q[:, None] & visible & (s == float("inf")), r[:, None], p)
    return keep, d / tau, p, p_dv


@triton.jit
def attention_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, m_ptr, r_ptr, c_ptr, tau_ptr, dk_ptr, dv_ptr, dtau_ptr,
    keep_ptr, kend_ptr, lq, lk, d, dv, scale, n_kblocks, heads,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr, HAS_MASK: tl.constexpr,
):
    """dk and dv of one block of keys over every query that sees them, and the block's
    share of sum ds z (dtau's first term)."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_DV)
    col_ok = offs_n < lk
    key_ok = _keys(keep_ptr, bh, heads, lk, offs_n, col_ok, HAS_MASK)
    kt = tl.load(*_tile_t(k_ptr + bh * lk * d, d, offs_n, key_ok, offs_d), other=0.0)
    vt = tl.load(*_tile_t(v_ptr + bh * lk * dv, dv, offs_n, key_ok, offs_e), other=0.0)
    tau = tl.load(tau_ptr + bh)
    kk = LOG2E / tau
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dvv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    dsz = tl.zeros([BLOCK_N], dtype=tl.float32)
    begin = 0
    if CAUSAL:
        begin = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    stop = lq  # a key block past the batch's last kept key visits no query
    if HAS_MASK:
        stop = tl.where(pid_n * BLOCK_N < tl.load(kend_ptr + bh // heads), lq, begin)
    for start in range(begin, stop, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        row_ok = offs_m < lq
        q = tl.load(*_tile(q_ptr + bh * lq * d, d, offs_m, row_ok, offs_d), other=0.0)
        do = tl.load(*_tile(do_ptr + bh * lq * dv, dv, offs_m, row_ok, offs_e), other=0.0)
        m, r, c, nan_q, inf_q = _query_stats(m_ptr, r_ptr, c_ptr, bh * lq + offs_m, row_ok)
        keep, z, p, p_dv = _recompute(q, kt, m, r, nan_q, inf_q, offs_m, offs_n, row_ok,
                                      key_ok, scale, kk, tau, CAUSAL, IEEE)
        if IEEE:
            dp = tl.dot(do, vt, input_precision="ieee")
            ds = tl.where(keep, p * ((dp - c[:, None]) / tau), 0.0)
            dvv += tl.dot(tl.trans(p_dv), do, input_precision="ieee")
            dk += tl.dot(tl.trans(ds), q, input_precision="ieee") * scale
        else:
            dp = tl.dot(do, vt)
            ds = tl.where(keep, p * ((dp - c[:, None]) / tau), 0.0)
            dvv += tl.dot(tl.trans(p_dv.to(do.dtype)), do)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q) * scale
        dsz += tl.sum(tl.where(keep, ds * z, 0.0), axis=0)
    dk_at, dk_ok = _tile(dk_ptr + bh * lk * d, d, offs_n, col_ok, offs_d)
    tl.store(dk_at, dk, mask=dk_ok)
    dv_at, dv_ok = _tile(dv_ptr + bh * lk * dv, dv, offs_n, col_ok, offs_e)
    tl.store(dv_at, dvv, mask=dv_ok)
    tl.store(dtau_ptr + bh * n_kblocks + pid_n, tl.sum(dsz, axis=0))


@triton.jit
def attention_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, m_ptr, r_ptr, c_ptr, tau_ptr, dq_ptr, keep_ptr, kend_ptr,
    lq, lk, d, dv, scale, heads,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr, HAS_MASK: tl.constexpr,
):
    """dq of one block of queries over every key it sees."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < lq
    q = tl.load(*_tile(q_ptr + bh * lq * d, d, offs_m, row_ok, offs_d), other=0.0)
    do = tl.load(*_tile(do_ptr + bh * lq * dv, dv, offs_m, row_ok, offs_e), other=0.0)
    m, r, c, nan_q, inf_q = _query_stats(m_ptr, r_ptr, c_ptr, bh * lq + offs_m, row_ok)
    tau = tl.load(tau_ptr + bh)
    kk = LOG2E / tau
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = _key_end(kend_ptr, bh, heads, lk, (pid_m + 1) * BLOCK_M, CAUSAL, HAS_MASK)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        col_ok = _keys(keep_ptr, bh, heads, lk, offs_n, offs_n < lk, HAS_MASK)
        kt = tl.load(*_tile_t(k_ptr + bh * lk * d, d, offs_n, col_ok, offs_d), other=0.0)
        vt = tl.load(*_tile_t(v_ptr + bh * lk * dv, dv, offs_n, col_ok, offs_e), other=0.0)
        keep, _z, p, _ = _recompute(q, kt, m, r, nan_q, inf_q, offs_m, offs_n, row_ok, col_ok,
                                    scale, kk, tau, CAUSAL, IEEE)
        if IEEE:
            dp = tl.dot(do, vt, input_precision="ieee")
            ds = tl.where(keep, p * ((dp - c[:, None]) / tau), 0.0)
            dq += tl.dot(ds, tl.trans(kt), input_precision="ieee") * scale
        else:
            dp = tl.dot(do, vt)
            ds = tl.where(keep, p * ((dp - c[:, None]) / tau), 0.0)
            dq += tl.dot(ds.to(kt.dtype), tl.trans(kt)) * scale
    dq_at, dq_ok = _tile(dq_ptr + bh * lq * d, d, offs_m, row_ok, offs_d)
    tl.store(dq_at, dq.to(dq_ptr.dtype.element_ty), mask=dq_ok)


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       dout: torch.Tensor, m: torch.Tensor, den: torch.Tensor,
                       tau: torch.Tensor, beta: torch.Tensor, scale: float, causal: bool,
                       key_mask: torch.Tensor | None = None, tile: Tiles | None = None
                       ) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) in q's dtype and (dtau, dbeta) per (batch, head) in fp32, from the
    forward's (out, m, den): docs/attention.md section 2, as the tiled torch code does."""
    b, h, lq, d = q.shape
    lk, dv_ = k.shape[2], v.shape[3]
    qc, kc, vc, doc = (t.contiguous() for t in (q, k, v, dout))
    tau32, beta32 = tau.to(torch.float32).contiguous(), beta.to(torch.float32).contiguous()
    m32 = m.to(torch.float32).contiguous()
    r = torch.where(den == 0, 0, 1 / den).to(torch.float32).contiguous()
    c = (dout.float() * out.float()).sum(-1).contiguous()
    dq = torch.empty_like(qc)
    dk = torch.empty(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.empty(v.shape, dtype=torch.float32, device=q.device)
    t = tile or tiles(q.dtype, backward=True)
    nk = triton.cdiv(lk, t.block_n)
    dtau_parts = torch.zeros(b * h, nk, dtype=torch.float32, device=q.device)
    consts = {"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "BLOCK_D": _pow2(d),
              "BLOCK_DV": _pow2(dv_), "CAUSAL": bool(causal), "IEEE": q.dtype == torch.float32,
              "HAS_MASK": key_mask is not None}
    keep, kend = _key_mask(key_mask, b, lk, q.device)
    run(attention_dkdv_kernel, (nk, b * h),
        (qc, kc, vc, doc, m32, r, c, tau32, dk, dv, dtau_parts, keep, kend, lq, lk, d, dv_,
         float(scale), nk, h), t.warps, consts, t.stages)
    run(attention_dq_kernel, (triton.cdiv(lq, t.block_m), b * h),
        (qc, kc, vc, doc, m32, r, c, tau32, dq, keep, kend, lq, lk, d, dv_, float(scale), h),
        t.warps, consts, t.stages)
    dtau, dbeta = param_grads(dtau_parts.reshape(b, h, nk).sum(-1), c, m32, den, tau32, beta32)
    return dq, dk.to(q.dtype), dv.to(q.dtype), dtau, dbeta
