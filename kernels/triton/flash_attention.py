"""Elastic attention in Triton, forward and backward: the tiled design of docs/attention.md
section 2, in the FlashAttention-2 structure (docs/attention.md section 7).

Forward: one program per block of BLOCK_M queries of one (batch, head), streaming blocks of
BLOCK_N keys, with per query a running maximum m of the raw kept scores q.k (from 0: kept
scores are >= 0), a running sum l and an accumulator:

    qk   = q @ k^T                                  (raw: the scale is folded below)
    m'   = max(m, max qk)                           (NaN-propagating; negative qk cannot win)
    t    = qk k2 - m' k2,  k2 = scale log2(e)/tau   (one constant per head; one FMA each)
    p    = 2^t where qk >= 0, else 0
    l    = l 2^(m k2 - m' k2) + sum p;   acc = acc 2^(m k2 - m' k2) + p @ v
    out  = acc / den,  den = l + beta 2^(-m k2)     (exactly 0 where l = 0: nothing kept)

It returns m (in score units, m scale) and den. Masks (causal diagonal, the key length, key
padding) are applied only on the key blocks that need them; the others run an unmasked loop.
The causal diagonal is j <= i + offset, `offset` a runtime integer of every program (0:
top-left, SDPA's is_causal; lk - lq: bottom-right, a decode step's; docs/attention.md
sections 1 and 7): blocks wholly above it are skipped, a block whose queries see no key
stores out = 0.
Special values need no per-tile test: a NaN score makes m NaN, and NaN reaches l and acc
through the rescale; a +inf score makes m k2 = +inf (so does a finite m whose m k2 overflows),
and such a query (`saturated`: its weights are 1 on the scores equal to its maximum and 0
elsewhere, docs/attention.md section 3) is finished by a second pass over its keys that runs
only in a block that has one.

Backward: a preprocessing program per block of queries forms c = rowsum(dO o), the per-query
operands of the weights (m k2, 1/den, the keep threshold), the sink terms of dtau and dbeta
summed per block, and a per-(batch, head) flag of saturated queries; then one program per
block of BLOCK_M keys (resident) accumulates dk and dv over the queries, and one per block of
BLOCK_M queries (resident) accumulates dq and the block's sum ds z (dtau's first term). Both
recompute p = 2^(qk k2 - m k2) / den per tile. dtau and dbeta are the fixed-order sums of the
per-block partials, on the device.

A configuration with `tma` (attention_configs.Tiles) loads q, k, v and dO and stores out, dq,
dk and dv through device-side tensor descriptors (Hopper's TMA) instead of pointer tiles,
with the same values (docs/attention.md section 7); a call whose tensors TMA cannot address
runs its tiles with pointer loads.

Launches: q, k, v, dO (and out, which the backward reads) are read where they lie, through
their (batch, head) strides and a row stride (a compile-time constant: it depends on the
layout, heads x dim for a transposed (batch, length, heads, dim) view, never on the length),
copied only where their last dimension is not contiguous; 64-bit row offsets only where a
row offset may pass 2^31 (WIDE). The outputs are the wrapper's own, contiguous. The
parameters are read from the caller's tensors in their own float type through (batch,
head) strides (0 where broadcast). Every launch runs under a guard that makes q's device
current (its current stream), on a (b h, blocks) grid: b h on the x axis, up to 2^31 - 1.

Scores, sums and accumulators are fp32. fp32 inputs multiply in IEEE fp32 (not TF32); fp16
and bf16 multiply in their own format with fp32 accumulation, and p and ds are rounded once
to it for the second matmuls (the budget's l term, docs/attention.md section 5).

The row function is one @triton.jit helper per direction selected by the constexpr WEIGHT
(elasticbench.attention.weights.Weight); `WEIGHTS` lists those this kernel implements: all
of them. The exp family (Elastic; softmax1, Elastic at tau = beta = 1 keeping every score)
is the above. The sums family has no running max: symax and stablemax add f(s) (|s|, st(s))
to l and f(s) v to acc, out = acc / den with den = eta + l (symax) or l, m = 0 (NaN for a
NaN query, +inf for a saturated one: l = +inf, finished by the same second pass over its
infinite weights; an overflowed sum with none is NaN); sigmoid adds sigmoid(s + bias) v
with no normalizer (m = 0, den = 1). Their backward recomputes y = f(s)/den and takes
ds = f'(s)/den (dp - c), sigmoid's dp y (1 - y); d eta = -sum c/den (preprocessing) and
d bias = sum ds (the dq program), per (batch, head) (docs/attention.md sections 7 and 9).
Cog (signed attention) runs the exp family's paths on |s|: the running max is of |qk| (a
hidden key's score 0, not kept: it enters no sum), p = 2^(|qk| k2 - m k2) joins l, and
sign(qk) p joins acc (a zero score weighs 0 but counts in den = l); a saturated query takes
sign(s)/count on the scores whose |s| is its maximum. Its backward recomputes p = |w| and
takes ds = p dp - w c, and dv the signed w; no parameter.

The gate (HAS_GATE): the forward's epilogue multiplies the fp32 output by the caller's gate
tile (read through its strides) before the one rounding to q's dtype, and with KEEP_UNGATED
also stores the ungated output; the backward is the ungated one (the caller passes the
ungated output and dO g).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from elasticbench.attention.weights import Weight
from elasticbench.devices import triton_interpreted

from .attention_configs import Tiles, choose, tma_available
from .exp_family import exp2
from .launch import current_options, run
from .memory import max_nan

WEIGHTS = frozenset(Weight)

LOG2E = tl.constexpr(1.4426950408889634)  # a kernel may read only constexpr globals
LN2 = tl.constexpr(0.6931471805599453)
# the exponent argument of a weight that is not kept: 2^-1e30 = 0 (also on the SUBNORMAL
# path), and 0 * -1e30 = 0 where -inf would make dtau's sum ds t NaN
OFF = tl.constexpr(-1.0e30)
# the exp family (a running max) is WEIGHT <= SOFTMAX1 or WEIGHT == COG (its max is of |s|)
ELASTIC = tl.constexpr(int(Weight.ELASTIC))
SOFTMAX1 = tl.constexpr(int(Weight.SOFTMAX1))
SYMAX = tl.constexpr(int(Weight.SYMAX))
STABLEMAX = tl.constexpr(int(Weight.STABLEMAX))
SIGMOID = tl.constexpr(int(Weight.SIGMOID))
COG = tl.constexpr(int(Weight.COG))
PREP_M = 64  # queries per preprocessing program


# ---------------------------------------------------------------------------------------
# The weight: the only part that depends on the row function


@triton.jit
def _weight_arg(qk, mk, k2, keep, WEIGHT: tl.constexpr):
    """The exp family's exponent argument of each weight of a tile of raw scores qk, OFF
    where not kept; mk is the query's statistic (its maximum times k2). Elastic and softmax1
    alike (softmax1 is Elastic at tau = 1, beta = 1 that keeps every score: the host passes
    those); Cog's argument is of |qk| (its maximum is of |s|, tau = 1)."""
    if WEIGHT == COG:
        arg = tl.where(keep, tl.abs(qk) * k2 - mk, OFF)
    else:
        arg = tl.where(keep, qk * k2 - mk, OFF)
    return arg


@triton.jit
def _signed(p, qk):
    """Cog's signed weights: sign(qk) p, 0 at a zero score (sign(0) = 0: a zero score enters
    the denominator, not the output); a NaN score keeps p (NaN: its query is NaN)."""
    return tl.where(qk < 0.0, -p, tl.where(qk == 0.0, 0.0, p))


@triton.jit
def _kept(qk, lo, WEIGHT: tl.constexpr):
    """Which scores of a tile take part: qk >= lo, lo the query's threshold (_floor: 0 for
    Elastic, -inf for the others; -inf for a NaN query, whose every visible weight is NaN;
    NaN for a saturated one, which the fix-up takes). The weights other than Elastic and
    softmax1 keep a NaN score too (it is NaN in its own products; unless saturated)."""
    keep = qk >= lo
    if WEIGHT > SOFTMAX1:
        keep = keep | ((qk != qk) & (lo == lo))
    return keep


@triton.jit
def _row_fn(s, bias, WEIGHT: tl.constexpr):
    """The unnormalized weight of the sums family of each scaled score s: |s| (symax),
    st(s) (stablemax), sigmoid(s + bias) (sigmoid); NaN stays NaN, +-inf take the limit."""
    tl.static_assert((WEIGHT == SYMAX) or (WEIGHT == STABLEMAX) or (WEIGHT == SIGMOID),  # noqa: SIM109
                     "no such weight in this Triton kernel")
    if WEIGHT == SYMAX:
        f = tl.abs(s)
    elif WEIGHT == STABLEMAX:  # where picks NaN's 1/(1 - NaN): NaN
        f = tl.where(s >= 0.0, s + 1.0, 1.0 / (1.0 - s))
    else:
        f = tl.sigmoid(s + bias)
    return f


@triton.jit
def _weight(qk, mk, k2, scale, bias, keep, SUBNORMAL: tl.constexpr, WEIGHT: tl.constexpr,
            EXP2_ULPS: tl.constexpr):
    """The unnormalized weight of each raw score qk of a tile, 0 where not kept: 2^arg for
    the exp family, else _row_fn of qk scale. EXP2_ULPS >= 0: the interpreter's model of
    the GPU's ex2.approx (exp_family.exp2, docs/triton.md); -1 on a GPU."""
    if WEIGHT <= SOFTMAX1 or WEIGHT == COG:
        f = exp2(_weight_arg(qk, mk, k2, keep, WEIGHT), SUBNORMAL, EXP2_ULPS)
    else:
        f = tl.where(keep, _row_fn(qk * scale, bias, WEIGHT), 0.0)
    return f


@triton.jit
def _dscore(f, y, qk, keep, r, dp, c, tau, inv_tau, SUBNORMAL: tl.constexpr,
            WEIGHT: tl.constexpr):
    """ds = dL/ds of each score from its weight f, normalized y = f r (0 where not kept), and
    dp = dO . v: symax and stablemax f'(s) r (dp - c); sigmoid dp y (1 - y); Cog y dp -
    sign(s) y c (y = |w|; at s = 0 y dp); the exp family y (dp - c)/tau (softmax1: tau = 1),
    in fp16 (no SUBNORMAL) divided by _ds_half(tau) =
    2^k ~ 1/sqrt(tau), which the callers multiply back on the fp32 sums (_ds_unit): ds is
    rounded to fp16 for the dots, and at a small tau (1e-3) y (dp - c)/tau passes 65504,
    while y (dp - c) alone would fall under fp16's normal range for the small ds (9 of 180
    fp16 verify cases at tau = 1e-3 failed so); a power of two splits the range and changes
    no rounding elsewhere."""
    if WEIGHT <= SOFTMAX1:
        ds = y * (dp - c)
        if SUBNORMAL:  # noqa: SIM108 (a constexpr branch)
            ds = ds * inv_tau
        else:
            ds = ds * (inv_tau * tl.math.div_rn(1.0, _ds_half(tau)))
    elif WEIGHT == COG:  # exp(|s|)' = sign(s) exp(|s|), and d den/ds = w den
        ds = y * dp - _signed(y, qk) * c
    elif WEIGHT == SYMAX:  # |s|' = sign(s) (0 at 0, as abs's subgradient)
        slope = tl.where(qk > 0.0, 1.0, tl.where(qk < 0.0, -1.0, 0.0))
        ds = tl.where(keep, slope, 0.0) * r * (dp - c)
    elif WEIGHT == STABLEMAX:  # 1 on the right (f >= 1), 1/(1 - s)^2 = f^2 on the left
        g = tl.minimum(f, 1.0)
        ds = g * g * r * (dp - c)
    else:
        ds = dp * y * (1.0 - y)
    return ds


@triton.jit
def _ds_half(tau):
    """2^k with k = max(0, floor(log2(1/tau) / 2)): the power of two of fp16 ds's 1/tau
    applied to the fp32 sums instead (_dscore); exact, formed from the exponent bits."""
    k = tl.minimum(tl.maximum(tl.floor(-tl.log2(tau) * 0.5), 0.0), 126.0)
    return ((k.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _ds_unit(tau, SUBNORMAL: tl.constexpr, WEIGHT: tl.constexpr):
    """What a sum of _dscore's ds is multiplied by to be in ds's units: _ds_half(tau) for
    the exp family in fp16, else 1."""
    if WEIGHT <= SOFTMAX1 and not SUBNORMAL:  # noqa: SIM108 (a constexpr branch)
        unit = _ds_half(tau)
    else:
        unit = 1.0
    return unit


@triton.jit
def _head_ptr(ptr, sb, sh, batch, head):
    """ptr moved to one (batch, head): batch sb + head sh elements, in 64 bits."""
    return ptr + batch.to(tl.int64) * sb + head.to(tl.int64) * sh


@triton.jit
def _bh_params(pscore_ptr, pscore_sb, pscore_sh, pden_ptr, pden_sb, pden_sh, batch, head,
               WEIGHT: tl.constexpr):
    """The kernels' (tau, beta) of one (batch, head), in fp32, from the caller's p_score and
    p_den (their own float type, at batch sb + head sh: a stride of 0 broadcasts a scalar or
    a per-head tensor): Elastic's (tau, beta); softmax1 (1, 1), Elastic at tau = beta = 1;
    symax (1, eta); stablemax (1, 0); sigmoid (bias, 0). A slot the weight does not use is
    never read (an unused one is never a divisor of 0)."""
    return (_bh_tau(pscore_ptr, pscore_sb, pscore_sh, batch, head, WEIGHT),
            _bh_beta(pden_ptr, pden_sb, pden_sh, batch, head, WEIGHT))


@triton.jit
def _bh_tau(pscore_ptr, pscore_sb, pscore_sh, batch, head, WEIGHT: tl.constexpr):
    """The tau of _bh_params, from p_score (all the backward's dk/dv and dq programs need)."""
    tau = tl.full([], 1.0, tl.float32)
    if WEIGHT == ELASTIC or WEIGHT == SIGMOID:  # noqa: SIM109
        tau = tl.load(_head_ptr(pscore_ptr, pscore_sb, pscore_sh, batch, head)).to(tl.float32)
    return tau


@triton.jit
def _bh_beta(pden_ptr, pden_sb, pden_sh, batch, head, WEIGHT: tl.constexpr):
    """The beta of _bh_params, from p_den."""
    beta = tl.full([], 0.0, tl.float32)
    if WEIGHT == ELASTIC or WEIGHT == SYMAX:  # noqa: SIM109
        beta = tl.load(_head_ptr(pden_ptr, pden_sb, pden_sh, batch, head)).to(tl.float32)
    elif WEIGHT == SOFTMAX1:
        beta = tl.full([], 1.0, tl.float32)
    return beta


@triton.jit
def _grid_place(REVERSED: tl.constexpr, BH_X: tl.constexpr):
    """(block, batch-head) of this program on the grid `grid` makes: (blocks, b h), so that
    the programs that run together are one head's blocks, which share its keys and values in
    L2; BH_X: (b h, blocks), b h on the x axis, which takes 2^31 - 1 where y stops at 65535.
    REVERSED: the last block first (the longest causal query blocks first). Both are program
    ids, which the compiler re-reads instead of holding (a flat grid's quotient, held across
    the tile loops, costs the head-dim-128 dk/dv tiles 8-56 B of spills per thread)."""
    if BH_X:
        block = tl.program_id(1)
        if REVERSED:
            block = tl.num_programs(1) - 1 - block
        bh = tl.program_id(0)
    else:
        block = tl.program_id(0)
        if REVERSED:
            block = tl.num_programs(0) - 1 - block
        bh = tl.program_id(1)
    return block, bh


@triton.jit
def _program_rows(REVERSED: tl.constexpr, BH_X: tl.constexpr, heads, length,
                  BLOCK: tl.constexpr):
    """This program's place (_grid_place) as the kernels use it: (block, bh, batch, head,
    first, rows, rows_ok), its BLOCK rows first + [0, BLOCK) of a (batch, head) whose
    length is `length`, rows_ok where a row lies inside it."""
    block, bh = _grid_place(REVERSED, BH_X)
    batch = bh // heads
    head = bh - batch * heads
    first = block * BLOCK
    rows = first + tl.arange(0, BLOCK)
    return block, bh, batch, head, first, rows, rows < length


@triton.jit
def _hit(qk, scale, ms, WEIGHT: tl.constexpr):
    """Where a saturated query's weight is infinite (its limit weights): the scores equal to
    its maximum ms (exp family; Cog: |s| = ms, signed by _signed), |s| = inf (symax),
    s = +inf (stablemax)."""
    s = qk * scale
    if WEIGHT <= SOFTMAX1:
        hit = s == ms
    elif WEIGHT == COG:
        hit = tl.abs(s) == ms
    elif WEIGHT == SYMAX:
        hit = tl.abs(s) == float("inf")
    else:
        hit = s == float("inf")
    return hit


# ---------------------------------------------------------------------------------------
# Loads


@triton.jit
def _tile_ptrs(base, offs_r, stride, BLOCK_W: tl.constexpr):
    """Pointers to rows offs_r of a matrix whose rows lie `stride` elements apart (its
    columns 1 apart) at base: offsets in 32 bits for a constexpr stride, in 64 for an int64
    one (_row_stride)."""
    offs_c = tl.arange(0, BLOCK_W)
    return base + offs_r[:, None] * stride + offs_c[None, :]


@triton.jit
def _row_stride(stride: tl.constexpr, WIDE: tl.constexpr):
    """A kernel's row stride as its tiles use it: the constexpr itself, or with WIDE (a row
    times a row stride may pass 2^31: a long transposed view, whose rows are heads x dim
    apart) an int64 scalar, which makes every row offset 64-bit. Only where needed: 64-bit
    row offsets cost the head-dim-128 dk/dv and dq tiles 8-88 B of spills per thread."""
    if WIDE:  # noqa: SIM108 (a constexpr branch)
        r = tl.full([], stride, tl.int64)
    else:
        r = stride
    return r


@triton.jit
def _load_rows(base, offs_r, row_ok, stride, W: tl.constexpr, BLOCK_W: tl.constexpr,
               MASKED: tl.constexpr):
    """Rows offs_r of a matrix of W columns at base, rows `stride` apart, (rows, BLOCK_W);
    lanes past W, and with MASKED rows where not row_ok, read 0."""
    offs_c = tl.arange(0, BLOCK_W)
    ptrs = _tile_ptrs(base, offs_r, stride, BLOCK_W)
    if MASKED:
        x = tl.load(ptrs, mask=row_ok[:, None] & (offs_c[None, :] < W), other=0.0)
    elif W == BLOCK_W:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=offs_c[None, :] < W, other=0.0)
    return x


@triton.jit
def _rows_source(ptr, rows, stride, W: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_W: tl.constexpr, TMA: tl.constexpr):
    """What _read takes blocks of a (rows, W) matrix at ptr, rows `stride` elements apart,
    from: with TMA a tensor descriptor of (BLOCK_R, BLOCK_W) blocks (past `rows` and W it
    reads 0, writes nothing; the host checked its 16-byte rules, _tma_ok), else ptr itself."""
    if TMA:
        src = tl.make_tensor_descriptor(ptr, shape=[rows, W], strides=[stride, 1],
                                        block_shape=[BLOCK_R, BLOCK_W])
    else:
        src = ptr
    return src


@triton.jit
def _read(src, start, offs_r, row_ok, stride, W: tl.constexpr, BLOCK_W: tl.constexpr,
          MASKED: tl.constexpr, HOLES: tl.constexpr, TMA: tl.constexpr):
    """Rows offs_r = start + arange of a _rows_source, as _load_rows reads them: lanes past W,
    and with MASKED rows where not row_ok, are 0. A descriptor zeroes only the rows past the
    end; HOLES (key padding: row_ok has holes inside the matrix) zeroes the others, so a
    padded key's inf or NaN never meets a zero weight."""
    if TMA:
        x = src.load([start, 0])
        if MASKED and HOLES:
            x = tl.where(row_ok[:, None], x, tl.zeros_like(x))
    else:
        x = _load_rows(src, offs_r, row_ok, stride, W, BLOCK_W, MASKED)
    return x


@triton.jit
def _write(dst, start, offs_r, row_ok, x, stride, W: tl.constexpr, BLOCK_W: tl.constexpr,
           TMA: tl.constexpr):
    """Store x (rows offs_r = start + arange, BLOCK_W lanes) into a _rows_source in its
    element type: rows not row_ok (past the end) and lanes past W are not written."""
    if TMA:
        dst.store([start, 0], x.to(dst.dtype))
    else:
        offs_c = tl.arange(0, BLOCK_W)
        tl.store(_tile_ptrs(dst, offs_r, stride, BLOCK_W), x.to(dst.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_c[None, :] < W))


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:  # noqa: SIM108 (a constexpr branch: the compiler keeps one side)
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def _key_ok(keep_ptr, batch, lk, offs_n, HAS_MASK: tl.constexpr):
    """The keys offs_n that exist (< lk) and, with a key-padding mask, are kept by it."""
    ok = offs_n < lk
    if HAS_MASK:
        ok = ok & (tl.load(keep_ptr + batch.to(tl.int64) * lk + offs_n, mask=ok, other=0) != 0)
    return ok


@triton.jit
def _query_ranges(m0, lk, offset, kend_ptr, batch, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    """For a query block starting at m0: (end of the unmasked key blocks, end of all keys it
    visits). Causally (query i sees key j iff j <= i + offset) no key past what its last
    query sees, and unmasked only the blocks its first query sees whole; both 0 where no
    query of the block sees a key (offset < -m0: its queries keep nothing, out = 0); with key
    padding none after the batch's last kept key, and every block masked (the mask may have
    holes)."""
    end = lk
    full = lk // BLOCK_N * BLOCK_N
    if CAUSAL:  # clamped at 0 before the division: // of a negative int32 truncates
        end = tl.minimum(lk, tl.maximum(m0 + BLOCK_M + offset, 0))
        full = tl.minimum(full, tl.maximum(m0 + 1 + offset, 0) // BLOCK_N * BLOCK_N)
    if HAS_MASK:
        end = tl.minimum(end, tl.load(kend_ptr + batch))
        full = 0
    return full, end


# ---------------------------------------------------------------------------------------
# Forward


@triton.jit
def _fwd_tile(q, k_src, v_src, sk, sv, keep_ptr, batch, start, offs_m, m, mk, l, acc, k2,  # noqa: E741
              scale, bias, lk, offset,
              D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MASKED: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, IEEE: tl.constexpr,
              SUBNORMAL: tl.constexpr, WEIGHT: tl.constexpr, TMA: tl.constexpr,
              EXP2_ULPS: tl.constexpr):
    """One block of keys folded into a query block's running (m, l, acc); Cog's m is of |qk|
    and its weights enter acc signed; the sums family (symax, stablemax, sigmoid) keeps m = 0
    and plain sums. k_src, v_src: _rows_source; causally query i sees key j iff j <= i +
    offset."""
    offs_n = start + tl.arange(0, BLOCK_N)
    col_ok = _key_ok(keep_ptr, batch, lk, offs_n, HAS_MASK)
    # a padded key's score is hidden below: k needs no zeroing (HOLES off)
    k = _read(k_src, start, offs_n, col_ok, sk, D, BLOCK_D, MASKED, False, TMA)
    qk = _dot(q, tl.trans(k), IEEE)
    if MASKED:
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & ((offs_n - offset)[None, :] <= offs_m[:, None])
        if WEIGHT == COG:  # noqa: SIM108 (|-inf| would win the max: a hidden 0, not kept)
            qk = tl.where(visible, qk, 0.0)
        else:
            qk = tl.where(visible, qk, float("-inf"))
    if WEIGHT <= SOFTMAX1 or WEIGHT == COG:
        if WEIGHT == COG:  # noqa: SIM108 (a constexpr branch)
            top = max_nan(tl.abs(qk), 1)
        else:
            top = max_nan(qk, 1)
        m_new = tl.maximum(m, top, propagate_nan=tl.PropagateNan.ALL)
        mk_new = m_new * k2
        # exactly 1 while the maximum stands (mk - m_new k2 contracted to an FMA would not be
        # 0, and l, acc would drift by its rounding error once per block)
        alpha = tl.where(m == m_new, 1.0, exp2(mk - mk_new, False, EXP2_ULPS))
        if WEIGHT != COG:
            keep = _kept(qk, _floor(WEIGHT), WEIGHT)
        elif MASKED:  # Cog keeps every visible score (a NaN one made m NaN)
            keep = visible
        else:
            keep = tl.full(qk.shape, True, tl.int1)
        p = _weight(qk, mk_new[:, None], k2, scale, bias, keep, SUBNORMAL, WEIGHT, EXP2_ULPS)
        l = l * alpha + tl.sum(p, axis=1)  # noqa: E741
        if WEIGHT == COG:  # a zero score is in l, not in acc
            p = _signed(p, qk)
    else:
        # hidden keys do not exist (|-inf| would be a weight); NaN scores are kept
        m_new = m
        mk_new = mk
        p = _row_fn(qk * scale, bias, WEIGHT)
        if MASKED:
            p = tl.where(visible, p, 0.0)
        l = l + tl.sum(p, axis=1)  # noqa: E741
        if (WEIGHT == SYMAX or WEIGHT == STABLEMAX) and not SUBNORMAL:  # noqa: SIM109
            # fp16 (the one input format without SUBNORMAL: _consts): p v rounds p to fp16,
            # whose largest finite is 65504, and |s|, st(s) are unbounded: p enters acc as
            # p 2^-m, m the running exponent of the largest weight (m >= 0; a power-of-two
            # rescale of acc, as the exp family's)
            e = tl.ceil(tl.log2(tl.max(p, axis=1)))
            m_new = tl.where((e > m) & (e < float("inf")), e, m)
            alpha = tl.where(m_new == m, 1.0, exp2(m - m_new, True, -1))
            p = p * exp2(-m_new, True, -1)[:, None]
    v = _read(v_src, start, offs_n, col_ok, sv, DV, BLOCK_DV, MASKED, HAS_MASK, TMA)
    if IEEE:  # noqa: SIM108
        pv = _dot(p, v, True)
    else:
        pv = _dot(p.to(v.dtype), v, False)
    if WEIGHT <= SOFTMAX1 or WEIGHT == COG or \
            ((WEIGHT == SYMAX or WEIGHT == STABLEMAX) and not SUBNORMAL):  # noqa: SIM109
        acc = acc * alpha[:, None] + pv
    else:
        acc = acc + pv
    return m_new, mk_new, l, acc


# offset unspecialized: a decode step's lk - lq varies per call, one compile serves all
@triton.jit(do_not_specialize=["offset"])
def attention_forward_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, m_ptr, den_ptr, pscore_ptr, pden_ptr, keep_ptr, kend_ptr, sq_b,
    sq_h, sq_l: tl.constexpr, sk_b, sk_h, sk_l: tl.constexpr, sv_b, sv_h,
    sv_l: tl.constexpr, pscore_b, pscore_h, pden_b, pden_h, gate_ptr, ungated_ptr, sg_b, sg_h,
    sg_l: tl.constexpr, lq, lk, offset, scale, scale_log2e, heads, n_blocks,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr, IEEE: tl.constexpr, SUBNORMAL: tl.constexpr,
    WEIGHT: tl.constexpr, TMA: tl.constexpr, EXP2_ULPS: tl.constexpr,
    WIDE: tl.constexpr, BH_X: tl.constexpr, HAS_GATE: tl.constexpr,
    KEEP_UNGATED: tl.constexpr,
):
    """out, m and den of one block of BLOCK_M queries of one (batch, head). q, k, v and out
    are reached through their (batch, head, row) strides, their columns 1 apart; the
    parameters through their (batch, head) strides (_bh_params); with CAUSAL query i sees
    key j iff j <= i + offset (a runtime integer: 0 top-left, lk - lq bottom-right). With
    HAS_GATE the epilogue writes out = O g, g read through its (batch, head, row) strides
    (sg_*), and with KEEP_UNGATED O itself into ungated (the wrapper's own, contiguous);
    without, gate_ptr, ungated_ptr and sg_* are never read."""
    sq_r = _row_stride(sq_l, WIDE)
    sk_r = _row_stride(sk_l, WIDE)
    sv_r = _row_stride(sv_l, WIDE)
    # the longest causal blocks first (they are the last query blocks)
    _, bh, batch, head, m0, offs_m, row_ok = _program_rows(True, BH_X, heads, lq, BLOCK_M)
    bh64 = bh.to(tl.int64)
    q_src = _rows_source(_head_ptr(q_ptr, sq_b, sq_h, batch, head), lq, sq_r, D, BLOCK_M,
                         BLOCK_D, TMA)
    q = _read(q_src, m0, offs_m, row_ok, sq_r, D, BLOCK_D, True, False, TMA)
    k_base = _head_ptr(k_ptr, sk_b, sk_h, batch, head)
    v_base = _head_ptr(v_ptr, sv_b, sv_h, batch, head)
    k_src = _rows_source(k_base, lk, sk_r, D, BLOCK_N, BLOCK_D, TMA)
    v_src = _rows_source(v_base, lk, sv_r, DV, BLOCK_N, BLOCK_DV, TMA)
    # tau holds sigmoid's bias, beta symax's eta
    tau, beta = _bh_params(pscore_ptr, pscore_b, pscore_h, pden_ptr, pden_b, pden_h, batch, head,
                           WEIGHT)
    k2 = tl.math.div_rn(scale_log2e, tau)
    m = tl.zeros([BLOCK_M], dtype=tl.float32)
    mk = tl.zeros([BLOCK_M], dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)  # noqa: E741
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    full, end = _query_ranges(m0, lk, offset, kend_ptr, batch, BLOCK_M, BLOCK_N, CAUSAL,
                              HAS_MASK)
    for start in range(0, full, BLOCK_N):
        m, mk, l, acc = _fwd_tile(q, k_src, v_src, sk_r, sv_r, keep_ptr, batch, start,  # noqa: E741
                                  offs_m, m, mk, l, acc, k2, scale, tau, lk, offset, D, DV, BLOCK_N,
                                  BLOCK_D, BLOCK_DV, False, CAUSAL, HAS_MASK, IEEE, SUBNORMAL,
                                  WEIGHT, TMA, EXP2_ULPS)
    for start in range(full, end, BLOCK_N):
        m, mk, l, acc = _fwd_tile(q, k_src, v_src, sk_r, sv_r, keep_ptr, batch, start,  # noqa: E741
                                  offs_m, m, mk, l, acc, k2, scale, tau, lk, offset, D, DV, BLOCK_N,
                                  BLOCK_D, BLOCK_DV, True, CAUSAL, HAS_MASK, IEEE, SUBNORMAL,
                                  WEIGHT, TMA, EXP2_ULPS)
    if WEIGHT <= SOFTMAX1 or WEIGHT == COG:
        saturated = (mk == float("inf")) & row_ok
    else:  # an infinite weight, or a sum that overflows (refused below: NaN)
        saturated = (l == float("inf")) & row_ok  # sigmoid's bounded weights: never
    nan_row = l != l
    if tl.max(saturated.to(tl.int32), axis=0) > 0:
        # weights 1 on the scores equal to the maximum, 0 elsewhere (Cog: sign(s) where |s| is
        # the maximum): the count in l, the sum of those keys' (signed) values in acc
        ms = m * scale
        l = tl.where(saturated, 0.0, l)  # noqa: E741
        acc = tl.where(saturated[:, None], 0.0, acc)  # no second accumulator: registers
        for start in range(0, end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            col_ok = _key_ok(keep_ptr, batch, lk, offs_n, HAS_MASK)
            k = _load_rows(k_base, offs_n, col_ok, sk_r, D, BLOCK_D, True)
            qk = _dot(q, tl.trans(k), IEEE)
            hit = col_ok[None, :] & saturated[:, None] & _hit(qk, scale, ms[:, None], WEIGHT)
            if CAUSAL:
                hit = hit & ((offs_n - offset)[None, :] <= offs_m[:, None])
            v = _load_rows(v_base, offs_n, col_ok, sv_r, DV, BLOCK_DV, True)
            l += tl.sum(hit.to(tl.float32), axis=1)  # noqa: E741
            if WEIGHT == COG:
                acc += _dot(_signed(hit.to(tl.float32), qk).to(v.dtype), v, IEEE)
            else:
                acc += _dot(hit.to(v.dtype), v, IEEE)
        mk = tl.where(saturated, float("inf"), mk)
        if WEIGHT > SOFTMAX1 and WEIGHT != COG:  # no infinite weight: the sum overflowed
            m = tl.where(saturated, 0.0, m)  # fp16's exponent: the fix-up's acc is unscaled
            l = tl.where(saturated & (l == 0.0), float("nan"), l)  # noqa: E741
    e16 = m  # the sums family's fp16 exponent (0 otherwise)
    if WEIGHT <= SOFTMAX1:
        den = l + beta * exp2(-mk, False, EXP2_ULPS)  # saturated: the count; m NaN: NaN
    elif WEIGHT == COG:  # no sink: l alone (0 where nothing is visible)
        den = l
    elif WEIGHT == SIGMOID:  # m = 0, den = 1: out = acc, NaN only in its own products
        den = tl.full([BLOCK_M], 1.0, tl.float32)
        l = tl.full([BLOCK_M], 1.0, tl.float32)  # noqa: E741
    else:  # symax, stablemax: m marks the NaN and the saturated queries (in score units)
        den = l
        if WEIGHT == SYMAX:
            den = tl.where(saturated, l, l + beta)
        m = tl.where(nan_row, float("nan"), tl.where(saturated, float("inf"), 0.0)) / scale
    live = (l > 0.0) | (l != l)
    safe = tl.where(live, den, 1.0)
    if IEEE:
        out = tl.math.div_rn(acc, safe[:, None])
    elif (WEIGHT == SYMAX or WEIGHT == STABLEMAX) and not SUBNORMAL:  # noqa: SIM109
        # acc holds sum f 2^-e v (fp16): times 2^e / den
        out = acc * tl.math.div_rn(1.0, safe * exp2(-e16, True, -1))[:, None]
    else:
        out = acc * tl.math.div_rn(1.0, safe)[:, None]
    out = tl.where(live[:, None], out, 0.0)
    if HAS_GATE:  # the gate in the epilogue: no pass over the output of its own
        if KEEP_UNGATED:
            u_dst = _rows_source(ungated_ptr + bh64 * lq * DV, lq, DV, DV, BLOCK_M, BLOCK_DV,
                                 TMA)
            _write(u_dst, m0, offs_m, row_ok, out, _row_stride(DV, WIDE), DV, BLOCK_DV, TMA)
        # batch and head again from bh: held across the loops they would cost registers
        g_batch = bh // heads
        g_head = bh - g_batch * heads
        g_base = gate_ptr + g_batch.to(tl.int64) * sg_b + g_head.to(tl.int64) * sg_h
        gate = _load_rows(g_base, offs_m, row_ok, _row_stride(sg_l, WIDE), DV, BLOCK_DV, True)
        out = out * gate.to(tl.float32)
    # out is the wrapper's own, contiguous
    o_dst = _rows_source(out_ptr + bh64 * lq * DV, lq, DV, DV, BLOCK_M, BLOCK_DV, TMA)
    _write(o_dst, m0, offs_m, row_ok, out, _row_stride(DV, WIDE), DV, BLOCK_DV, TMA)
    tl.store(m_ptr + bh64 * lq + offs_m, m * scale, mask=row_ok)
    tl.store(den_ptr + bh64 * lq + offs_m, den, mask=row_ok)


@triton.jit
def _floor(WEIGHT: tl.constexpr):
    """The keep threshold of an ordinary query: Elastic keeps scores >= 0, softmax1 all."""
    if WEIGHT == ELASTIC:  # noqa: SIM108
        lo = 0.0
    else:
        lo = float("-inf")
    return lo


Param = torch.Tensor | float


def _param(p: Param, b: int, h: int, device: torch.device, name: str
           ) -> tuple[torch.Tensor, int, int]:
    """A parameter as the kernels read it (_bh_params): the caller's tensor in its own float
    type, as a (batch, heads) view and its two strides (0 where broadcast), with no copy
    unless it is on another device or not a float type; a float, a 0-d, (heads,), (batch,
    heads) or (batch, heads, 1, 1) tensor, or any other shape that broadcasts to (batch,
    heads)."""
    if not isinstance(p, torch.Tensor):
        p = torch.full((), float(p), dtype=torch.float32, device=device)
    if p.device != device or not p.is_floating_point():
        p = p.to(device=device, dtype=p.dtype if p.is_floating_point() else torch.float32)
    if p.ndim == 4 and p.shape[2:] == (1, 1):
        p = p[:, :, 0, 0]
    try:
        view = p.expand(b, h)
    except RuntimeError:
        raise ValueError(f"the triton attention kernel's {name} must broadcast to (batch, "
                         f"heads) = ({b}, {h}), got shape {tuple(p.shape)}") from None
    return view, view.stride(0), view.stride(1)


def _offset(causal: bool, offset: int) -> int:
    """The kernels' causal offset: `offset` where causal (an int, |offset| < 2^31), else 0
    (unread: CAUSAL off)."""
    if not causal:
        return 0
    if isinstance(offset, bool) or not isinstance(offset, int) or abs(offset) >= 2**31:
        raise ValueError(f"the triton attention kernel's causal offset must be an integer "
                         f"of magnitude < 2^31, got {offset!r}")
    return offset


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))


_NO_MASK: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _key_mask(key_mask: torch.Tensor | None, batch: int, lk: int, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' key-padding operands: (batch, length_k) int8 keep flags and, per batch,
    one past the last kept key (int32); without a mask, one placeholder pair per device,
    never read (HAS_MASK off), made on the first call."""
    if key_mask is None:
        dummy = _NO_MASK.get(device)
        if dummy is None:
            flags = torch.zeros(1, dtype=torch.int32, device=device)
            dummy = _NO_MASK.setdefault(device, (flags.to(torch.int8), flags))
        return dummy
    keep = key_mask.to(device=device, dtype=torch.bool).reshape(batch, lk)
    last = torch.where(keep, torch.arange(1, lk + 1, device=device), 0).amax(-1)
    return keep.to(torch.int8).contiguous(), last.to(torch.int32).contiguous()


def _check(q: torch.Tensor, scale: float, weight: Weight, *others: torch.Tensor) -> None:
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"the triton attention kernel takes fp32, fp16 or bf16, not {q.dtype}")
    if Weight(weight) not in WEIGHTS:
        raise ValueError(f"the triton attention kernel implements {sorted(w.name for w in WEIGHTS)}"
                         f", not {Weight(weight).name}")
    if not (scale > 0 and scale < float("inf")):
        raise ValueError(f"the triton attention kernel needs a positive finite scale, got {scale}")
    for t in others:
        if t.device != q.device or t.dtype != q.dtype or t.ndim != 4:
            raise ValueError(f"the triton attention kernel takes 4-d tensors on one device in "
                             f"one dtype: q is {q.dtype} on {q.device}, another {t.ndim}-d "
                             f"{t.dtype} on {t.device}")


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """t (batch, heads, length, dim) as the kernels take it, with its (batch, head, row)
    strides: any layout whose columns are 1 apart as it is (a (batch, length, heads, dim)
    tensor transposed to (batch, heads, length, dim), heads sliced from a fused projection,
    heads broadcast by a stride of 0), else a contiguous copy."""
    st = t.stride()
    if st[3] != 1 and t.shape[3] > 1:
        t = t.contiguous()
        st = t.stride()
    return t, st[0], st[1], st[2]


def _exp2_ulps() -> int:
    """The EXP2_ULPS the kernels are compiled with: under the interpreter the ex2 model's
    ulps ($ELASTICBENCH_TRITON_EXP2_ULPS, docs/triton.md), else -1 (no model: the GPU's
    own ex2.approx)."""
    return current_options().exp2_ulps if triton_interpreted() else -1


def _wide(*tensors: torch.Tensor) -> bool:
    """Whether a row offset of these (batch, heads, length, dim) tensors may pass 2^31 (the
    kernels' WIDE: rows up to a block past the length, _row_stride)."""
    return any((t.shape[2] + 256) * t.stride(2) + t.shape[3] > 2**31 - 1 for t in tensors)


def _consts(q: torch.Tensor, d: int, dv: int, t: Tiles, causal: bool, has_mask: bool,
            weight: Weight, wide: bool) -> dict:
    return {"D": d, "DV": dv, "BLOCK_M": t.block_m, "BLOCK_N": t.block_n,
            "BLOCK_D": _pow2(d), "BLOCK_DV": _pow2(dv), "CAUSAL": bool(causal),
            "HAS_MASK": has_mask, "IEEE": q.dtype == torch.float32,
            # fp16's subnormals end above 2^-126, where ex2's flush is already right
            "SUBNORMAL": q.dtype != torch.float16, "WEIGHT": int(weight), "TMA": t.tma,
            "EXP2_ULPS": _exp2_ulps(), "WIDE": wide, "BH_X": bh_on_x(q.shape[0] * q.shape[1])}


GRID_X, GRID_Y = 2**31 - 1, 65535  # a CUDA grid's x dimension; y (and z) stop at 65535


def grid(blocks: int, bh: int) -> tuple[int, int]:
    """The grid of `blocks` programs for each of bh (batch, head) pairs: (blocks, bh), one
    head's blocks side by side (they share its keys and values in L2, as FlashAttention
    orders them), up to 65535 pairs; past that (bh, blocks), b h on the x axis (up to
    2^31 - 1), `bh_on_x` telling the kernels which; at most 65535 blocks of a length (4M
    queries at 64 a block)."""
    if bh > GRID_X or blocks > GRID_Y:
        raise ValueError(f"the triton attention kernel takes at most {GRID_X} (batch, head) "
                         f"pairs and {GRID_Y} blocks of a length, got {bh} and {blocks}")
    return (bh, blocks) if bh_on_x(bh) else (blocks, bh)


def bh_on_x(bh: int) -> bool:
    """Whether `grid` puts the (batch, head) pairs on the x axis (more than y takes)."""
    return bh > GRID_Y


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    """A CUDA device's compute capability, looked up once per device."""
    return torch.cuda.get_device_capability(device)


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether this call may move its (batch, heads, length, dim) tensors, columns 1 apart,
    through tensor descriptors: the installed Triton has them; on a GPU one of compute
    capability 9.0 or later (the interpreter and the compile audit's CPU tensors take any);
    TMA's 16-byte rules on the addresses each descriptor gets: the base of every (batch,
    head), so the data pointer and the batch and head strides, and the row stride and the
    row's width in bytes."""
    if not tma_available():
        return False
    if tensors[0].is_cuda and not triton_interpreted() and \
            _capability(tensors[0].device) < (9, 0):
        return False
    for t in tensors:
        size, st, shape = t.element_size(), t.stride(), t.shape
        if t.data_ptr() % 16 or (shape[3] * size) % 16 or (st[2] * size) % 16:
            return False
        if (shape[0] > 1 and (st[0] * size) % 16) or (shape[1] > 1 and (st[1] * size) % 16):
            return False
    return True


def _on_device(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """The device guard of a launch on t: its device made current (so Triton launches there,
    on that device's current stream), or nothing where it already is or t is not on CUDA."""
    if t.is_cuda and torch.cuda.current_device() != t.device.index:
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def _torch_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global scratch for device-side tensor descriptors (triton.set_allocator's contract),
    from torch's caching allocator on the device of the launch: the launches run under
    _on_device, so that is the current one."""
    return torch.empty(size, dtype=torch.int8, device=torch.device("cuda", torch.cuda.current_device()))


def _usable(t: Tiles, q: torch.Tensor, tma: bool) -> Tiles:
    """t as this call can launch it: a TMA configuration where the call's tensors do not
    allow descriptors (tma False) runs its tiles with pointer loads. A TMA launch on a GPU
    writes its descriptors to global scratch: Triton gets torch's allocator for it, unless
    the caller set one."""
    if not t.tma:
        return t
    if not tma:
        return replace(t, tma=False)
    if q.is_cuda and not triton_interpreted():
        from triton.runtime import _allocation

        # where this Triton hides whether one is set, set it (a TMA launch needs one)
        current = getattr(getattr(_allocation, "_allocator", None), "get", None)
        null = getattr(_allocation, "NullAllocator", None)
        if current is None or null is None or isinstance(current(), null):
            triton.set_allocator(_torch_scratch)
    return t


def _timer(launch):
    """time_one for attention_configs.choose: do_bench's median of one launch, in ms."""
    def time_one(t: Tiles) -> float:
        return float(triton.testing.do_bench(lambda: launch(t), warmup=5, rep=20,
                                             return_mode="median"))
    return time_one


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      p_score: Param, p_den: Param, scale: float, causal: bool,
                      key_mask: torch.Tensor | None = None, weight: Weight = Weight.ELASTIC,
                      tile: Tiles | None = None, offset: int = 0,
                      gate: torch.Tensor | None = None, keep_ungated: bool = False
                      ) -> tuple[torch.Tensor, ...]:
    """(out in q's dtype, m, den) with out (batch, heads, length_q, dim_v) contiguous, m and
    den (batch, heads, length_q) in fp32; q, k, v (batch, heads, length, dim) in fp32, fp16
    or bf16, in any layout whose last dimension is contiguous (a transposed (batch, length,
    heads, dim) view is read in place; others are copied); p_score, p_den: the weight's parameters
    (weights.py; Weight.ELASTIC's tau and beta), each a float or a tensor that
    broadcasts to (batch, heads) (also (batch, heads, 1, 1)), read by the kernel in its own
    float type; key_mask (batch, length_k) bool, True where a key takes part, or None; tile:
    a configuration of attention_configs (else the tuned or interpreter one); offset: the
    causal diagonal, query i seeing key j iff j <= i + offset (0: top-left, SDPA's
    is_causal; length_k - length_q: bottom-right, a decode cache's; read only with causal);
    gate: None or a tensor that broadcasts to out's shape (batch, heads, length_q, dim_v),
    fp32, fp16 or bf16, on q's device (the gate's values, already through its sigmoid),
    read in place through its strides where its last dimension is contiguous: the
    epilogue writes out = O g, rounded once to q's dtype (O the fp32 ungated output);
    keep_ungated: return (out, m, den, ungated) with ungated = O rounded to q's dtype,
    contiguous (out itself where there is no gate). The kernel runs on q's device and its
    current stream."""
    _check(q, scale, weight, k, v)
    offset = _offset(causal, offset)
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[3]
    dev = q.device
    (qc, *sq), (kc, *sk), (vc, *sv) = _rows(q), _rows(k), _rows(v)
    (ps, *s_ps), (pd, *s_pd) = _param(p_score, b, h, dev, "p_score"), _param(p_den, b, h, dev,
                                                                          "p_den")
    out = torch.empty(b, h, lq, dv, dtype=q.dtype, device=dev)
    m = torch.empty(b, h, lq, dtype=torch.float32, device=dev)
    den = torch.empty_like(m)
    has_gate = gate is not None
    if has_gate:
        gc, *sg = _rows(_gate(gate, out))
        ungated = torch.empty_like(out) if keep_ungated else out
    else:  # placeholders, never read (HAS_GATE off)
        gc, sg, ungated = out, [0, 0, 0], out
    keep, kend = _key_mask(key_mask, b, lk, dev)
    has_mask = key_mask is not None
    sl2e = float(scale) * 1.4426950408889634  # rounded once, to fp32, by the launch
    wide = _wide(qc, kc, vc, out, *((gc,) if has_gate else ()))

    tma = _tma_ok(qc, kc, vc, out, ungated)
    gated = {"HAS_GATE": has_gate, "KEEP_UNGATED": has_gate and bool(keep_ungated)}

    def launch(t: Tiles) -> None:
        t = _usable(t, q, tma)
        blocks = triton.cdiv(lq, t.block_m)
        with _on_device(q):
            run(attention_forward_kernel, grid(blocks, b * h),
                (qc, kc, vc, out, m, den, ps, pd, keep, kend, *sq, *sk, *sv, *s_ps, *s_pd, gc,
                 ungated, *sg, lq, lk, offset, float(scale), sl2e, h, blocks),
                t.warps, {**_consts(q, d, dv, t, causal, has_mask, weight, wide), **gated},
                t.stages)

    if b * h * lq != 0:
        launch(tile or choose("fwd", max(d, dv), q, causal, has_mask, _timer(launch), weight,
                              tma, max(lq, lk)))
    return (out, m, den, ungated) if keep_ungated else (out, m, den)


def _gate(gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The gate as the forward kernel reads it: a (batch, heads, length_q, dim_v) view of the
    caller's tensor (stride 0 where broadcast), which must be a tensor of fp32, fp16 or bf16
    on out's device that broadcasts to out's shape."""
    if not isinstance(gate, torch.Tensor):
        raise TypeError(f"the triton attention kernel's gate must be a tensor or None, got "
                        f"{type(gate).__name__}")
    if gate.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"the triton attention kernel's gate must be fp32, fp16 or bf16, "
                        f"not {gate.dtype}")
    if gate.device != out.device:
        raise ValueError(f"the triton attention kernel's gate is on {gate.device}, q on "
                         f"{out.device}")
    try:
        return gate.expand(out.shape)
    except RuntimeError:
        raise ValueError(f"the triton attention kernel's gate must broadcast to the output's "
                         f"shape {tuple(out.shape)}, got {tuple(gate.shape)}") from None


# ---------------------------------------------------------------------------------------
# Backward


@triton.jit
def attention_prepare_kernel(
    out_ptr, do_ptr, m_ptr, den_ptr, pscore_ptr, pden_ptr, stats_ptr, sink_ptr, flag_ptr, so_b,
    so_h, so_l: tl.constexpr, sd_b, sd_h, sd_l: tl.constexpr, pscore_b, pscore_h, pden_b, pden_h, lq,
    heads, n_bh, n_blocks,
    DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, WEIGHT: tl.constexpr,
    EXP2_ULPS: tl.constexpr, WIDE: tl.constexpr, BH_X: tl.constexpr,
):
    """Per query: c = rowsum(dO o), m k2 / scale (= m log2(e)/tau, 0 where saturated), 1/den
    and the keep threshold lo, into stats (4, batch*heads*length_q); per block the sums of
    dtau's and dbeta's sink terms (docs/attention.md section 2) into sink (2, bh, blocks);
    per (batch, head) the number of saturated queries into flag."""
    so_r = _row_stride(so_l, WIDE)
    sd_r = _row_stride(sd_l, WIDE)
    pid, bh, batch, head, _, offs_m, row_ok = _program_rows(False, BH_X, heads, lq, BLOCK_M)
    bh64 = bh.to(tl.int64)
    o = _load_rows(_head_ptr(out_ptr, so_b, so_h, batch, head), offs_m, row_ok, so_r, DV,
                   BLOCK_DV, True)
    do = _load_rows(_head_ptr(do_ptr, sd_b, sd_h, batch, head), offs_m, row_ok, sd_r, DV,
                    BLOCK_DV, True)
    c = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    at = bh64 * lq + offs_m
    m = tl.load(m_ptr + at, mask=row_ok, other=0.0)
    den = tl.load(den_ptr + at, mask=row_ok, other=0.0)
    tau, beta = _bh_params(pscore_ptr, pscore_b, pscore_h, pden_ptr, pden_b, pden_h, batch, head,
                           WEIGHT)
    kk = tl.math.div_rn(LOG2E, tau)
    if WEIGHT <= SOFTMAX1 or WEIGHT == COG:
        mk = m * kk
        saturated = mk == float("inf")
    else:  # m is 0, +inf (saturated) or NaN; tau holds sigmoid's bias
        saturated = m == float("inf")
        mk = tl.zeros([BLOCK_M], dtype=tl.float32)
    r = tl.where(den == 0.0, 0.0, tl.math.div_rn(1.0, tl.where(den == 0.0, 1.0, den)))
    lo = tl.where(m != m, float("-inf"), tl.where(saturated, float("nan"), _floor(WEIGHT)))
    n = n_bh.to(tl.int64) * lq  # stride between the four stats
    tl.store(stats_ptr + at, c, mask=row_ok)
    tl.store(stats_ptr + n + at, tl.where(saturated, 0.0, mk), mask=row_ok)
    tl.store(stats_ptr + 2 * n + at, r, mask=row_ok)
    tl.store(stats_ptr + 3 * n + at, lo, mask=row_ok)
    # the sink terms, as flash.param_grads forms them: a saturated query adds nothing
    ok = row_ok & ~saturated
    if WEIGHT <= SOFTMAX1:
        ms = tl.where(saturated, 0.0, m)
        e = exp2(-(ms * kk), True, EXP2_ULPS)
        w = beta * e * r
        wm = tl.where(w != 0.0, w * tl.math.div_rn(ms, tau), 0.0)
        tsink = tl.where(ok, tl.math.div_rn(c * wm, tau), 0.0)
        dbeta = tl.where(ok, c * e * r, 0.0)
    else:  # symax's d eta = -sum c / den (into dbeta's place); the others (Cog) have no sink
        tsink = tl.zeros([BLOCK_M], dtype=tl.float32)
        dbeta = tl.zeros([BLOCK_M], dtype=tl.float32)
        if WEIGHT == SYMAX:
            dbeta = tl.where(ok, c * r, 0.0)
    tl.store(sink_ptr + bh64 * n_blocks + pid, tl.sum(tsink, axis=0))
    tl.store(sink_ptr + (n_bh + bh64) * n_blocks + pid, tl.sum(dbeta, axis=0))
    tl.atomic_add(flag_ptr + bh, tl.sum((saturated & row_ok).to(tl.int32), axis=0))


@triton.jit
def _query_stats(stats_ptr, n, at, row_ok, MASKED: tl.constexpr):
    """(c, m k2, 1/den, lo) of queries at; with MASKED rows past the end read lo = NaN
    (nothing kept) and 0."""
    if MASKED:
        c = tl.load(stats_ptr + at, mask=row_ok, other=0.0)
        mk = tl.load(stats_ptr + n + at, mask=row_ok, other=0.0)
        r = tl.load(stats_ptr + 2 * n + at, mask=row_ok, other=0.0)
        lo = tl.load(stats_ptr + 3 * n + at, mask=row_ok, other=float("nan"))
    else:
        c = tl.load(stats_ptr + at)
        mk = tl.load(stats_ptr + n + at)
        r = tl.load(stats_ptr + 2 * n + at)
        lo = tl.load(stats_ptr + 3 * n + at)
    return c, mk, r, lo


@triton.jit
def _dkdv_tile(k, v, dk, dv, q_src, do_src, sq, sd, stats_ptr, n, at0, start, offs_n, k2,
               inv_tau, scale, bias, lq, offset, D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MASKED: tl.constexpr,
               CAUSAL: tl.constexpr, IEEE: tl.constexpr, SUBNORMAL: tl.constexpr,
               WEIGHT: tl.constexpr, TMA: tl.constexpr, EXP2_ULPS: tl.constexpr):
    """One block of queries folded into a key block's dk (without the exp family's 1/tau:
    _dscore) and dv (transposed tiles: keys are rows, so every dot's M is the resident key
    block). q_src, do_src: _rows_source, rows sq and sd apart."""
    offs_m = start + tl.arange(0, BLOCK_M)
    row_ok = offs_m < lq
    q = _read(q_src, start, offs_m, row_ok, sq, D, BLOCK_D, MASKED, False, TMA)
    do = _read(do_src, start, offs_m, row_ok, sd, DV, BLOCK_DV, MASKED, False, TMA)
    c, mk, r, lo = _query_stats(stats_ptr, n, at0 + offs_m, row_ok, MASKED)
    qk = _dot(k, tl.trans(q), IEEE)  # (keys, queries)
    keep = _kept(qk, lo[None, :], WEIGHT)
    if MASKED and CAUSAL:
        keep = keep & ((offs_n - offset)[:, None] <= offs_m[None, :])
    f = _weight(qk, mk[None, :], k2, scale, bias, keep, SUBNORMAL, WEIGHT, EXP2_ULPS)
    p = f * r[None, :]
    dp = _dot(v, tl.trans(do), IEEE)
    ds = _dscore(f, p, qk, keep, r[None, :], dp, c[None, :], bias, inv_tau, SUBNORMAL, WEIGHT)
    if WEIGHT == COG:  # dv takes the signed weights
        p = _signed(p, qk)
    if IEEE:
        dv += _dot(p, do, True)
        dk += _dot(ds, q, True)
    else:
        dv += _dot(p.to(do.dtype), do, False)
        dk += _dot(ds.to(q.dtype), q, False)
    return dk, dv


# offset unspecialized: a decode step's lk - lq varies per call, one compile serves all
@triton.jit(do_not_specialize=["offset"])
def attention_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, m_ptr, stats_ptr, flag_ptr, pscore_ptr, dk_ptr, dv_ptr,
    keep_ptr, kend_ptr, sq_b, sq_h, sq_l: tl.constexpr, sk_b, sk_h, sk_l: tl.constexpr,
    sv_b, sv_h, sv_l: tl.constexpr, sd_b, sd_h, sd_l: tl.constexpr, pscore_b, pscore_h, lq,
    lk, offset, scale, scale_log2e, heads, n_bh, n_blocks,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr, IEEE: tl.constexpr, SUBNORMAL: tl.constexpr,
    WEIGHT: tl.constexpr, TMA: tl.constexpr, EXP2_ULPS: tl.constexpr,
    WIDE: tl.constexpr, BH_X: tl.constexpr,
):
    """dk and dv of one block of BLOCK_M keys (resident) over the BLOCK_N-query blocks that
    see them (with CAUSAL query i sees key j iff j <= i + offset); every tensor of (batch,
    heads, length, dim) through its strides."""
    sq_r = _row_stride(sq_l, WIDE)
    sk_r = _row_stride(sk_l, WIDE)
    sv_r = _row_stride(sv_l, WIDE)
    sd_r = _row_stride(sd_l, WIDE)
    _, bh, batch, head, n0, offs_n, _ = _program_rows(False, BH_X, heads, lk, BLOCK_M)
    key_ok = _key_ok(keep_ptr, batch, lk, offs_n, HAS_MASK)
    k_src = _rows_source(_head_ptr(k_ptr, sk_b, sk_h, batch, head), lk, sk_r, D, BLOCK_M,
                         BLOCK_D, TMA)
    v_src = _rows_source(_head_ptr(v_ptr, sv_b, sv_h, batch, head), lk, sv_r, DV, BLOCK_M,
                         BLOCK_DV, TMA)
    # a padded key's row reaches only its own dk, dv rows, zeroed at the end: no HOLES (a
    # where would hold k and v in registers: 144-160 B of spills per thread at head dim 128)
    k = _read(k_src, n0, offs_n, key_ok, sk_r, D, BLOCK_D, True, False, TMA)
    v = _read(v_src, n0, offs_n, key_ok, sv_r, DV, BLOCK_DV, True, False, TMA)
    tau = _bh_tau(pscore_ptr, pscore_b, pscore_h, batch, head, WEIGHT)
    k2 = tl.math.div_rn(scale_log2e, tau)  # the stats hold m log2(e)/tau
    inv_tau = tl.math.div_rn(1.0, tau)
    q_base = _head_ptr(q_ptr, sq_b, sq_h, batch, head)
    do_base = _head_ptr(do_ptr, sd_b, sd_h, batch, head)
    q_src = _rows_source(q_base, lq, sq_r, D, BLOCK_N, BLOCK_D, TMA)
    do_src = _rows_source(do_base, lq, sd_r, DV, BLOCK_N, BLOCK_DV, TMA)
    bh64 = bh.to(tl.int64)
    n = n_bh.to(tl.int64) * lq
    at0 = bh64 * lq
    dk = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    stop = lq
    if HAS_MASK:  # a key block past the batch's last kept key is seen by no query
        stop = tl.where(n0 < tl.load(kend_ptr + batch), lq, 0)
    begin = 0
    full_lo = 0
    if CAUSAL:  # the first query block that sees key n0; the first that sees the block whole
        begin = tl.maximum(n0 - offset, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.cdiv(tl.maximum(n0 + BLOCK_M - 1 - offset, 0), BLOCK_N) * BLOCK_N
    full_hi = lq // BLOCK_N * BLOCK_N
    for start in range(begin, tl.minimum(full_lo, stop), BLOCK_N):
        dk, dv = _dkdv_tile(k, v, dk, dv, q_src, do_src, sq_r, sd_r, stats_ptr, n, at0, start,
                            offs_n, k2, inv_tau, scale, tau, lq, offset, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, True,
                            CAUSAL, IEEE, SUBNORMAL, WEIGHT, TMA, EXP2_ULPS)
    for start in range(full_lo, tl.minimum(full_hi, stop), BLOCK_N):
        dk, dv = _dkdv_tile(k, v, dk, dv, q_src, do_src, sq_r, sd_r, stats_ptr, n, at0, start,
                            offs_n, k2, inv_tau, scale, tau, lq, offset, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, False,
                            CAUSAL, IEEE, SUBNORMAL, WEIGHT, TMA, EXP2_ULPS)
    for start in range(tl.maximum(full_lo, full_hi), stop, BLOCK_N):
        dk, dv = _dkdv_tile(k, v, dk, dv, q_src, do_src, sq_r, sd_r, stats_ptr, n, at0, start,
                            offs_n, k2, inv_tau, scale, tau, lq, offset, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, True,
                            CAUSAL, IEEE, SUBNORMAL, WEIGHT, TMA, EXP2_ULPS)
    if tl.load(flag_ptr + bh) > 0:
        # saturated queries give dO / count to the dv of each key at their maximum
        for start in range(begin, stop, BLOCK_N):
            offs_m = start + tl.arange(0, BLOCK_N)
            row_ok = offs_m < lq
            q = _load_rows(q_base, offs_m, row_ok, sq_r, D, BLOCK_D, True)
            do = _load_rows(do_base, offs_m, row_ok, sd_r, DV, BLOCK_DV, True)
            ms = tl.load(m_ptr + at0 + offs_m, mask=row_ok, other=0.0)
            r = tl.load(stats_ptr + 2 * n + at0 + offs_m, mask=row_ok, other=0.0)
            lo = tl.load(stats_ptr + 3 * n + at0 + offs_m, mask=row_ok, other=0.0)
            # (k q^T: a wgmma whose M is the resident keys; q k^T's M would be BLOCK_N)
            qk = _dot(k, tl.trans(q), IEEE)
            hit = (lo != lo)[None, :] & _hit(qk, scale, ms[None, :], WEIGHT)
            if CAUSAL:
                hit = hit & ((offs_n - offset)[:, None] <= offs_m[None, :])
            share = tl.where(hit, r[None, :], 0.0)
            if WEIGHT == COG:  # sign(s) / count
                share = _signed(share, qk)
            if IEEE:
                dv += _dot(share, do, True)
            else:
                dv += _dot(share.to(do.dtype), do, False)
    if WEIGHT <= SOFTMAX1 and not SUBNORMAL:
        dk = dk * _ds_unit(tau, SUBNORMAL, WEIGHT)
    dk = tl.where(key_ok[:, None], dk * scale, 0.0)
    dv = tl.where(key_ok[:, None], dv, 0.0)
    col_ok = offs_n < lk
    # dk and dv are the wrapper's own, contiguous: addressed from bh, which the loop keeps
    # live anyway (their own strides would keep 4 more registers live: 40 B of spills per
    # thread in the causal 128x32 tiles at head dim 128)
    dk_dst = _rows_source(dk_ptr + bh64 * lk * D, lk, D, D, BLOCK_M, BLOCK_D, TMA)
    dv_dst = _rows_source(dv_ptr + bh64 * lk * DV, lk, DV, DV, BLOCK_M, BLOCK_DV, TMA)
    _write(dk_dst, n0, offs_n, col_ok, dk, _row_stride(D, WIDE), D, BLOCK_D, TMA)
    _write(dv_dst, n0, offs_n, col_ok, dv, _row_stride(DV, WIDE), DV, BLOCK_DV, TMA)


@triton.jit
def _dq_tile(q, do, dq, dsz, c, mk, r, lo, ms, k_src, v_src, sk, sv, keep_ptr, batch, start,
             offs_m, k2, inv_tau, scale, bias, lk, offset, D: tl.constexpr, DV: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
             MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
             IEEE: tl.constexpr, SUBNORMAL: tl.constexpr, WEIGHT: tl.constexpr,
             TMA: tl.constexpr, EXP2_ULPS: tl.constexpr):
    """One block of keys folded into a query block's dq and its per-query sum ds t, with t
    exactly 0 where the score is the query's maximum: there the exact z is 0 and the exact ds
    may be far below the rounding noise of the computed one (dtau's budget holds the term to
    the exact ds z); the fold's qk k2 - m k2 leaves the rounding error of m k2 there."""
    offs_n = start + tl.arange(0, BLOCK_N)
    col_ok = _key_ok(keep_ptr, batch, lk, offs_n, HAS_MASK)
    k = _read(k_src, start, offs_n, col_ok, sk, D, BLOCK_D, MASKED, HAS_MASK, TMA)
    v = _read(v_src, start, offs_n, col_ok, sv, DV, BLOCK_DV, MASKED, HAS_MASK, TMA)
    qk = _dot(q, tl.trans(k), IEEE)
    keep = _kept(qk, lo[:, None], WEIGHT)
    if MASKED:
        keep = keep & col_ok[None, :]
        if CAUSAL:
            keep = keep & ((offs_n - offset)[None, :] <= offs_m[:, None])
    f = _weight(qk, mk[:, None], k2, scale, bias, keep, SUBNORMAL, WEIGHT, EXP2_ULPS)
    p = f * r[:, None]
    dp = _dot(do, tl.trans(v), IEEE)
    ds = _dscore(f, p, qk, keep, r[:, None], dp, c[:, None], bias, inv_tau, SUBNORMAL, WEIGHT)
    if IEEE:
        dq += _dot(ds, k, True)
    else:
        dq += _dot(ds.to(k.dtype), k, False)
    if WEIGHT <= SOFTMAX1:
        t = tl.where(qk * scale == ms[:, None], 0.0,
                     _weight_arg(qk, mk[:, None], k2, keep, WEIGHT))
        dsz += tl.sum(ds * t, axis=1)
    elif WEIGHT == SIGMOID:  # d bias = sum ds
        dsz += tl.sum(ds, axis=1)
    return dq, dsz


# offset unspecialized: a decode step's lk - lq varies per call, one compile serves all
@triton.jit(do_not_specialize=["offset"])
def attention_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, m_ptr, stats_ptr, pscore_ptr, dq_ptr, dsz_ptr, keep_ptr,
    kend_ptr, sq_b, sq_h, sq_l: tl.constexpr, sk_b, sk_h, sk_l: tl.constexpr, sv_b, sv_h,
    sv_l: tl.constexpr, sd_b, sd_h, sd_l: tl.constexpr,
    pscore_b, pscore_h, lq, lk, offset, scale, scale_log2e, heads, n_bh, n_blocks,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr, IEEE: tl.constexpr, SUBNORMAL: tl.constexpr,
    WEIGHT: tl.constexpr, TMA: tl.constexpr, EXP2_ULPS: tl.constexpr,
    WIDE: tl.constexpr, BH_X: tl.constexpr,
):
    """dq of one block of queries (resident) over every key it sees (with CAUSAL query i sees
    key j iff j <= i + offset), and the block's
    sum ds (s - m)/tau (dtau's first term) into dsz (bh, blocks); every tensor of (batch,
    heads, length, dim) through its strides."""
    sq_r = _row_stride(sq_l, WIDE)
    sk_r = _row_stride(sk_l, WIDE)
    sv_r = _row_stride(sv_l, WIDE)
    sd_r = _row_stride(sd_l, WIDE)
    pid_m, bh, batch, head, m0, offs_m, row_ok = _program_rows(True, BH_X, heads, lq, BLOCK_M)
    bh64 = bh.to(tl.int64)
    q_src = _rows_source(_head_ptr(q_ptr, sq_b, sq_h, batch, head), lq, sq_r, D, BLOCK_M,
                         BLOCK_D, TMA)
    do_src = _rows_source(_head_ptr(do_ptr, sd_b, sd_h, batch, head), lq, sd_r, DV, BLOCK_M,
                          BLOCK_DV, TMA)
    q = _read(q_src, m0, offs_m, row_ok, sq_r, D, BLOCK_D, True, False, TMA)
    do = _read(do_src, m0, offs_m, row_ok, sd_r, DV, BLOCK_DV, True, False, TMA)
    n = n_bh.to(tl.int64) * lq
    c, mk, r, lo = _query_stats(stats_ptr, n, bh64 * lq + offs_m, row_ok, True)
    ms = tl.load(m_ptr + bh64 * lq + offs_m, mask=row_ok, other=0.0)
    tau = _bh_tau(pscore_ptr, pscore_b, pscore_h, batch, head, WEIGHT)
    k2 = tl.math.div_rn(scale_log2e, tau)
    inv_tau = tl.math.div_rn(1.0, tau)
    k_src = _rows_source(_head_ptr(k_ptr, sk_b, sk_h, batch, head), lk, sk_r, D, BLOCK_N,
                         BLOCK_D, TMA)
    v_src = _rows_source(_head_ptr(v_ptr, sv_b, sv_h, batch, head), lk, sv_r, DV, BLOCK_N,
                         BLOCK_DV, TMA)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dsz = tl.zeros([BLOCK_M], dtype=tl.float32)
    full, end = _query_ranges(m0, lk, offset, kend_ptr, batch, BLOCK_M, BLOCK_N, CAUSAL,
                              HAS_MASK)
    for start in range(0, full, BLOCK_N):
        dq, dsz = _dq_tile(q, do, dq, dsz, c, mk, r, lo, ms, k_src, v_src, sk_r, sv_r, keep_ptr,
                           batch, start, offs_m, k2, inv_tau, scale, tau, lk, offset, D, DV,
                           BLOCK_N, BLOCK_D, BLOCK_DV, False, CAUSAL, HAS_MASK, IEEE, SUBNORMAL,
                           WEIGHT, TMA, EXP2_ULPS)
    for start in range(full, end, BLOCK_N):
        dq, dsz = _dq_tile(q, do, dq, dsz, c, mk, r, lo, ms, k_src, v_src, sk_r, sv_r, keep_ptr,
                           batch, start, offs_m, k2, inv_tau, scale, tau, lk, offset, D, DV,
                           BLOCK_N, BLOCK_D, BLOCK_DV, True, CAUSAL, HAS_MASK, IEEE, SUBNORMAL,
                           WEIGHT, TMA, EXP2_ULPS)
    unit = _ds_unit(tau, SUBNORMAL, WEIGHT)  # the power of two _dscore leaves out
    # dq is the wrapper's own, contiguous
    dq_dst = _rows_source(dq_ptr + bh64 * lq * D, lq, D, D, BLOCK_M, BLOCK_D, TMA)
    _write(dq_dst, m0, offs_m, row_ok, dq * (scale * unit), _row_stride(D, WIDE), D, BLOCK_D,
           TMA)
    total = tl.sum(dsz, axis=0)
    if WEIGHT <= SOFTMAX1:  # sum ds (s - m)/tau: the exponents are in base 2
        total = total * LN2 * unit
    tl.store(dsz_ptr + bh64 * n_blocks + pid_m, total)


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       dout: torch.Tensor, m: torch.Tensor, den: torch.Tensor,
                       p_score: Param, p_den: Param, scale: float, causal: bool,
                       key_mask: torch.Tensor | None = None, weight: Weight = Weight.ELASTIC,
                       tiles: tuple[Tiles, Tiles] | None = None, offset: int = 0
                       ) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) in q's dtype, contiguous, and (dp_score, dp_den) = (dtau, dbeta) per (batch,
    head) in fp32, from the forward's (out, m, den): docs/attention.md section 2, as the
    tiled torch code computes them; q, k, v, out and dout in any layout attention_forward
    takes (read in place where their last dimension is contiguous), p_score and p_den as it
    takes them; tiles: (dk/dv, dq) configurations of attention_configs, else the tuned or
    interpreter ones; offset: the causal diagonal, as attention_forward takes it. The kernels
    run on q's device and its current stream."""
    _check(q, scale, weight, k, v, out, dout)
    offset = _offset(causal, offset)
    b, h, lq, d = q.shape
    lk, dv_ = k.shape[2], v.shape[3]
    dev = q.device
    (qc, *sq), (kc, *sk), (vc, *sv) = _rows(q), _rows(k), _rows(v)
    (oc, *so), (doc, *sd) = _rows(out), _rows(dout)
    (ps, *s_ps), (pd, *s_pd) = _param(p_score, b, h, dev, "p_score"), _param(p_den, b, h, dev,
                                                                          "p_den")
    m32, den32 = m.to(torch.float32).contiguous(), den.to(torch.float32).contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=dev)
    dk = torch.empty(k.shape, dtype=q.dtype, device=dev)
    dv = torch.empty(v.shape, dtype=q.dtype, device=dev)
    if b * h == 0 or lq == 0 or lk == 0:
        zero = torch.zeros(b, h, dtype=torch.float32, device=dev)
        return dq.zero_(), dk.zero_(), dv.zero_(), zero, zero.clone()
    keep, kend = _key_mask(key_mask, b, lk, dev)
    has_mask = key_mask is not None
    n_prep = triton.cdiv(lq, PREP_M)
    stats = torch.empty(4, b * h * lq, dtype=torch.float32, device=dev)
    sink = torch.empty(2, b * h, n_prep, dtype=torch.float32, device=dev)
    flag = torch.zeros(b * h, dtype=torch.int32, device=dev)
    wide = _wide(qc, kc, vc, oc, doc, dq, dk, dv)
    with _on_device(q):
        run(attention_prepare_kernel, grid(n_prep, b * h),
            (oc, doc, m32, den32, ps, pd, stats, sink, flag, *so, *sd, *s_ps, *s_pd, lq, h,
             b * h, n_prep),
            4, {"DV": dv_, "BLOCK_M": PREP_M, "BLOCK_DV": _pow2(dv_), "WEIGHT": int(weight),
                "EXP2_ULPS": _exp2_ulps(), "WIDE": wide, "BH_X": bh_on_x(b * h)})
    head_dim = max(d, dv_)
    sl2e = float(scale) * 1.4426950408889634
    common = (scale, causal, has_mask, weight, wide)

    tma = _tma_ok(qc, kc, vc, doc, dq, dk, dv)

    def launch_dkdv(t: Tiles) -> None:
        t = _usable(t, q, tma)
        blocks = triton.cdiv(lk, t.block_m)
        with _on_device(q):
            run(attention_dkdv_kernel, grid(blocks, b * h),
                (qc, kc, vc, doc, m32, stats, flag, ps, dk, dv, keep, kend, *sq, *sk, *sv,
                 *sd, *s_ps, lq, lk, offset, float(scale), sl2e, h, b * h, blocks),
                t.warps, _consts(q, d, dv_, t, *common[1:]), t.stages)

    dsz: list[torch.Tensor] = []

    def launch_dq(t: Tiles) -> None:
        t = _usable(t, q, tma)
        nb = triton.cdiv(lq, t.block_m)
        parts = torch.empty(b * h, nb, dtype=torch.float32, device=dev)
        with _on_device(q):
            run(attention_dq_kernel, grid(nb, b * h),
                (qc, kc, vc, doc, m32, stats, ps, dq, parts, keep, kend, *sq, *sk, *sv, *sd,
                 *s_ps, lq, lk, offset, float(scale), sl2e, h, b * h, nb),
                t.warps, _consts(q, d, dv_, t, *common[1:]), t.stages)
        dsz[:] = [parts]

    t_kv, t_q = tiles or (None, None)
    launch_dkdv(t_kv or choose("dkdv", head_dim, q, causal, has_mask, _timer(launch_dkdv),
                               weight, tma, max(lq, lk)))
    launch_dq(t_q or choose("dq", head_dim, q, causal, has_mask, _timer(launch_dq), weight,
                            tma, max(lq, lk)))
    w = Weight(weight)
    if w is Weight.ELASTIC:
        dtau = -(dsz[0].sum(-1) + sink[0].sum(-1)).reshape(b, h)
        return dq, dk, dv, dtau, -sink[1].sum(-1).reshape(b, h)
    zero = torch.zeros(b, h, dtype=torch.float32, device=dev)
    if w in (Weight.SOFTMAX1, Weight.STABLEMAX, Weight.COG):  # no parameter: zero gradients
        return dq, dk, dv, zero, zero.clone()
    if w is Weight.SYMAX:  # d eta = -sum c / den
        return dq, dk, dv, zero, -sink[1].sum(-1).reshape(b, h)
    if w is Weight.SIGMOID:  # d bias = sum ds
        return dq, dk, dv, dsz[0].sum(-1).reshape(b, h), zero
    raise AssertionError(f"no gradients for {w.name}")  # WEIGHTS is every Weight
