"""Ground truth for attention: exact outputs and gradients, certified or from mpmath.

The exact values are those of numerics/truth/attention_oracle.py: scores s_ij = scale * q_i . k_j
formed exactly, each query's weights its row function's exact reference over the keys it
sees, out_i = sum_j w_ij v_j, and for an upstream dO the row function's exact gradients
with g_j = dO_i . v_j carried to q, k and v and summed over the queries for the row
parameters (docs/attention.md section 2). They are obtained as the row truths are (Ziv's
strategy, docs/numerics.md section 6): the certified double-double phase first
(numerics/certified/attention_forward.py, certified/attention_grad.py), then mpmath, the oracle,
for the query rows (forward) or heads (gradients) whose bound does not certify in the
output format. Only truths that needed mpmath are kept on disk (numerics/truth/cache.py
TruthStore), and TruthStats counts the values and the share mpmath computed.
Values are stored as double-doubles (hi + lo) like the row truths (numerics/truth/row_truth.py).

Beside the values, the truth keeps what the error budget is built from (numerics/
budgets/attention_budgets.py): the weights in float64, |z_ij|, each query's zbar, its kind.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elasticbench.harness.functions import AttentionFunction
from elasticbench.harness.numerics.certified import (
    attention_forward as certified_attention,
)
from elasticbench.harness.numerics.certified import (
    attention_grad as certified_attention_grad,
)
from elasticbench.harness.numerics.dtypes import FloatFormat, get_format
from elasticbench.harness.numerics.truth import attention_oracle
from elasticbench.harness.numerics.truth.attention_values import (
    FORWARD_FIELDS,
    AttentionTruth,
    empty_truth,
)
from elasticbench.harness.numerics.truth.cache import TruthStats, TruthStore

ATTENTION_TRUTH_VERSION = 4  # 4: the oracle sums dot products exactly, rounds once
BLOCK_ELEMENTS = 1 << 20  # a certified block holds heads up to this many (Lq, Lk, dim) values
def oracle_evaluate(fn: AttentionFunction, params: dict[str, float], q: np.ndarray,
                    k: np.ndarray, v: np.ndarray, scale: float, dout: np.ndarray | None = None,
                    precision: int = 128, bias: np.ndarray | None = None) -> AttentionTruth:
    """The truth of fn on float64 copies of q, k, v (and dO) from mpmath alone; bias, a
    mask as kinds.attention.qkv_inputs.mask_bias lays it out, or None."""
    truth = empty_truth(q, k, v, len(fn.row_params), dout is not None)
    b_, h_, lq = q.shape[:3]
    if dout is None:
        rows = ((b, h, i) for b in range(b_) for h in range(h_) for i in range(lq))
        attention_oracle.forward_rows(truth, fn, params, q, k, v, scale, rows, precision,
                                      bias)
    else:
        heads = ((b, h) for b in range(b_) for h in range(h_))
        attention_oracle.gradient_heads(truth, fn, params, q, k, v, dout, scale, heads,
                                        precision, bias)
    return truth


def evaluate(fn: AttentionFunction, params: dict[str, float], q: np.ndarray, k: np.ndarray,
             v: np.ndarray, scale: float, dout: np.ndarray | None = None,
             precision: int = 128, fmt: FloatFormat | None = None,
             stats: TruthStats | None = None, store: TruthStore | None = None,
             bias: np.ndarray | None = None) -> AttentionTruth:
    """The exact truth of fn on float64 copies of q, k, v (and dO for gradients): certified
    where the bound allows in fmt (fp64, the strictest, unless given), from mpmath (or from
    store, which keeps the truths that needed it) elsewhere: the query rows whose outputs
    are not certified, the heads whose gradients are not. stats, if given, counts the
    values, those mpmath computed and the seconds of each phase. bias: a mask, float64
    (B, H, Lq, Lk), -inf where a key is hidden, else added to the score (None: no mask)."""
    fmt = fmt or get_format("fp64")
    stats = stats if stats is not None else TruthStats()
    started = time.perf_counter()
    cert = certified_phase(fn, params, q, k, v, scale, dout, fmt, bias)
    stats.fast_s += time.perf_counter() - started
    truth = cert.truth
    heads = ~cert.ok_heads if dout is not None else np.zeros(q.shape[:2], dtype=bool)
    rows = ~cert.ok_rows & ~heads[..., None]
    per_row, per_head = _values(truth)
    stats.elements += per_head * heads.size
    if not (rows.any() or heads.any()):
        return truth
    started = time.perf_counter()
    stats.fallback_elements += per_row * int(rows.sum()) + per_head * int(heads.sum())
    stats.fallback_rows += int(rows.sum()) + q.shape[2] * int(heads.sum())
    arrays = [q, k, v] + ([dout] if dout is not None else []) + ([bias] if bias is not None
                                                                 else [])
    key = truth_key(fn, params, arrays, scale, precision, fmt) + "-attention"
    cached = store.get(key, AttentionTruth) if store is not None else None  # type: ignore
    if cached is not None:  # the certified part is the same: take it whole
        stats.cached_elements += per_row * int(rows.sum()) + per_head * int(heads.sum())
        truth = cached  # type: ignore[assignment]
    else:
        _oracle(truth, rows, heads, fn, params, q, k, v, scale, dout, precision, bias)
        if store is not None:
            store.put(key, truth)  # type: ignore[arg-type]
    stats.fallback_s += time.perf_counter() - started
    return truth


def _values(truth: AttentionTruth) -> tuple[int, int]:
    """How many values a query row's forward holds, and a head's (gradients included)."""
    return truth.out_hi.shape[3], sum(int(np.prod(a.shape[2:])) for a in (
        truth.out_hi, truth.dq_hi, truth.dk_hi, truth.dv_hi) if a.ndim == 4)


def _oracle(truth: AttentionTruth, rows: np.ndarray, heads: np.ndarray, fn: AttentionFunction,
            params: dict[str, float], q: np.ndarray, k: np.ndarray, v: np.ndarray,
            scale: float, dout: np.ndarray | None, precision: int,
            bias: np.ndarray | None = None) -> None:
    """mpmath for the query rows (B, H, Lq) and the heads (B, H, forward and gradients)
    where rows and heads hold, in place (their forward values reset first: the oracle
    writes only what is not 0)."""
    for name in FORWARD_FIELDS[:-1]:
        getattr(truth, name)[rows] = 0
        getattr(truth, name)[heads] = 0
    attention_oracle.forward_rows(truth, fn, params, q, k, v, scale,
                                  map(tuple, np.argwhere(rows)), precision, bias)
    if dout is not None:
        attention_oracle.gradient_heads(truth, fn, params, q, k, v, dout, scale,
                                        map(tuple, np.argwhere(heads)), precision, bias)


@dataclass
class Certified:
    """The certified phase's truth, with the absolute bound of every value it holds, which
    query rows (B, H, Lq) it certified (their outputs) and which heads (B, H; their
    gradients): the others hold values that must not be used."""

    truth: AttentionTruth
    bounds: dict[str, np.ndarray]  # out, dq, dk, dv, dp like out_hi, ...; w, zabs, zbar
    ok_rows: np.ndarray
    ok_heads: np.ndarray
    trusted_rows: np.ndarray  # where the bounds hold (certified or not)
    trusted_heads: np.ndarray


def certified_phase(fn: AttentionFunction, params: dict[str, float], q: np.ndarray,
                    k: np.ndarray, v: np.ndarray, scale: float, dout: np.ndarray | None,
                    fmt: FloatFormat, bias: np.ndarray | None = None) -> Certified:
    """The certified truth, a block of heads at a time (numerics/certified/attention_forward.py)."""
    b_, h_, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[3]
    truth = empty_truth(q, k, v, len(fn.row_params), dout is not None)
    bounds = {name: np.zeros_like(getattr(truth, f"{name}_hi"))
              for name in ("out", "dq", "dk", "dv", "dp")}
    bounds.update({name: np.zeros_like(getattr(truth, name)) for name in ("w", "zabs", "zbar")})
    flat = [a.reshape(b_ * h_, *a.shape[2:]) for a in (q, k, v)]
    dflat = None if dout is None else dout.reshape(b_ * h_, lq, dv)
    bflat = None if bias is None else bias.reshape(b_ * h_, lq, lk)
    ok_rows, trusted_rows = np.zeros(b_ * h_ * lq, bool), np.zeros(b_ * h_ * lq, bool)
    ok_heads, trusted_heads = np.zeros(b_ * h_, bool), np.zeros(b_ * h_, bool)
    if not certified_attention.row_function_fits(fn, params):  # mpmath answers it all
        return Certified(truth, bounds, ok_rows.reshape(b_, h_, lq), ok_heads.reshape(b_, h_),
                         trusted_rows.reshape(b_, h_, lq), trusted_heads.reshape(b_, h_))
    per = max(1, BLOCK_ELEMENTS // (lq * lk * max(d, dv)))
    for start in range(0, b_ * h_, per):
        heads = slice(start, min(b_ * h_, start + per))
        rows = slice(heads.start * lq, heads.stop * lq)
        block = [a[heads] for a in flat]
        fw = certified_attention.forward_block(fn, params, *block, scale, fmt,
                                               None if bflat is None else bflat[heads])
        certified_attention.write_forward(truth, bounds, heads, fw)
        ok_rows[rows], trusted_rows[rows] = fw.ok, fw.trusted
        if dflat is not None:
            trusted_heads[heads], ok_heads[heads] = certified_attention_grad.gradient_block(
                truth, bounds, heads, fn, params, *block, dflat[heads], scale, fmt, fw)
    return Certified(truth, bounds, ok_rows.reshape(b_, h_, lq), ok_heads.reshape(b_, h_),
                     trusted_rows.reshape(b_, h_, lq), trusted_heads.reshape(b_, h_))


def truth_key(fn: AttentionFunction, params: dict[str, float], arrays: list[np.ndarray],
              scale: float, precision: int, fmt: FloatFormat) -> str:
    """A content hash of the question: function, params, scale, precision, the format it is
    certified in, input bytes."""
    h = hashlib.sha256()
    meta = [ATTENTION_TRUTH_VERSION, fn.name, sorted(params.items()), scale, precision,
            fmt.name, [list(a.shape) for a in arrays]]
    h.update(json.dumps(meta).encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


def cached_evaluate(directory: Path | None, fn: AttentionFunction, params: dict[str, float],
                    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                    dout: np.ndarray | None, precision: int, fmt: FloatFormat | None = None,
                    stats: TruthStats | None = None, bias: np.ndarray | None = None
                    ) -> AttentionTruth:
    """evaluate, with the mpmath part kept in the truths' content-addressed disk cache
    (None: no disk)."""
    return evaluate(fn, params, q, k, v, scale, dout, precision, fmt, stats,
                    TruthStore(directory), bias)
