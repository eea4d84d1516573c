"""Ground truth for attention: exact outputs and gradients in mpmath, per batch and head.

The scores s_ij = scale * q_i . k_j are formed exactly (mpmath at `precision` bits from the
exact inputs), each query's weights are its row function's exact reference over the keys it
sees (functions/), and out_i = sum_j w_ij v_j is summed exactly. The gradients for an
upstream dO are the row function's exact gradients with g_j = dO_i . v_j (docs/attention.md
section 2), carried to q, k and v, and summed over the queries for the row parameters.
Values are stored as double-doubles (hi + lo) like the row truths (numerics/truth.py).

Beside the values, the truth keeps what the error budget is built from (numerics/
attention_budget.py): the weights in float64, |z_ij|, each query's zbar, its kind.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import mpmath
import numpy as np

from ..functions import AttentionFunction
from ..functions.base import ROW_MASKED, ROW_NAN
from .truth import split_double
from .truth_cache import TruthStore

ATTENTION_TRUTH_VERSION = 2


@dataclass
class AttentionTruth:
    """Exact out (and, with dO, exact gradients) of one attention input."""

    out_hi: np.ndarray  # (B, H, Lq, Dv); NaN where out must be NaN
    out_lo: np.ndarray
    out_zero: np.ndarray  # bool: exactly 0 by structure (a query that keeps nothing)
    out_nan_ok: np.ndarray  # bool: NaN is acceptable (a non-finite v_j at weight 0)
    w: np.ndarray  # (B, H, Lq, Lk) float64 weights, 0 at hidden or masked keys
    zabs: np.ndarray  # (B, H, Lq, Lk) |z_ij| = |s_ij - m_i| / tau, 0 where not kept
    zbar: np.ndarray  # (B, H, Lq) the row's output-weighted mean |z|, sink included
    kind: np.ndarray  # (B, H, Lq) str: finite / nan / inf / masked
    # gradients (empty arrays when no dO was given)
    dq_hi: np.ndarray
    dq_lo: np.ndarray
    dk_hi: np.ndarray
    dk_lo: np.ndarray
    dv_hi: np.ndarray
    dv_lo: np.ndarray
    dzero_q: np.ndarray  # bool: exactly 0 by structure (nothing reaches it)
    dzero_k: np.ndarray
    dzero_v: np.ndarray
    dp_hi: np.ndarray  # (B, H, P): each row parameter's gradient per batch and head
    dp_lo: np.ndarray
    grad_nan_ok: np.ndarray  # (B, H) bool: a head with a non-finite input (0 x inf allowed)

    FIELDS: ClassVar[tuple[str, ...]] = ()  # set below: every field, in order (TruthStore)

    @property
    def has_gradients(self) -> bool:
        return self.dq_hi.size > 0

    def arrays(self) -> dict[str, np.ndarray]:
        out = {f: getattr(self, f) for f in self.FIELDS}
        out["kind"] = self.kind.astype("U8")
        return out


AttentionTruth.FIELDS = tuple(f.name for f in fields(AttentionTruth))



def _mp(a: np.ndarray) -> list:
    return [[mpmath.mpf(float(x)) for x in row] for row in a]


def evaluate(fn: AttentionFunction, params: dict[str, float], q: np.ndarray, k: np.ndarray,
             v: np.ndarray, scale: float, dout: np.ndarray | None = None,
             precision: int = 128) -> AttentionTruth:
    """The exact truth of fn on float64 copies of q, k, v (and dO for gradients)."""
    b_, h_, lq, _ = q.shape
    lk, dv_ = k.shape[2], v.shape[3]
    causal = bool(params.get("causal", 0.0))
    rowp = {n: params[n] for n in fn.row_params}
    grads = dout is not None
    f64 = np.float64
    out_hi, out_lo = np.zeros((b_, h_, lq, dv_)), np.zeros((b_, h_, lq, dv_))
    out_zero = np.zeros((b_, h_, lq, dv_), bool)
    nan_ok = np.zeros((b_, h_, lq, dv_), bool)
    w = np.zeros((b_, h_, lq, lk))
    zabs = np.zeros((b_, h_, lq, lk))
    zbar = np.zeros((b_, h_, lq))
    kind = np.empty((b_, h_, lq), dtype="U8")
    gshape = (lambda s: s) if grads else (lambda s: (0,))
    dq_hi, dq_lo = np.zeros(gshape(q.shape)), np.zeros(gshape(q.shape))
    dk_hi, dk_lo = np.zeros(gshape(k.shape)), np.zeros(gshape(k.shape))
    dv_hi, dv_lo = np.zeros(gshape(v.shape)), np.zeros(gshape(v.shape))
    dzq, dzk, dzv = (np.zeros(gshape(t.shape), bool) for t in (q, k, v))
    npar = len(fn.row_params)
    dp_hi, dp_lo = np.zeros((b_, h_, npar)), np.zeros((b_, h_, npar))
    grad_nan_ok = np.zeros((b_, h_), bool)
    with mpmath.workprec(precision):
        sc = mpmath.mpf(float(scale))
        zero = mpmath.mpf(0)
        for b in range(b_):
            for h in range(h_):
                Q, K, V = _mp(q[b, h]), _mp(k[b, h]), _mp(v[b, h])
                bad_v = ~np.isfinite(v[b, h])  # (Lk, Dv)
                DO = _mp(dout[b, h]) if grads else None
                DQ = [[zero] * q.shape[3] for _ in range(lq)]
                DK = [[zero] * k.shape[3] for _ in range(lk)]
                DV = [[zero] * dv_ for _ in range(lk)]
                touched_k = np.zeros(lk, bool)
                touched_v = np.zeros(lk, bool)
                touched_q = np.zeros(lq, bool)
                dpar = [[] for _ in range(npar)]
                grad_nan_ok[b, h] = not (np.isfinite(q[b, h]).all() and np.isfinite(k[b, h]).all()
                                         and not bad_v.any())
                for i in range(lq):
                    nvis = min(i + 1, lk) if causal else lk
                    s = [sc * mpmath.fdot(Q[i], K[j]) for j in range(nvis)]
                    rt = fn.row.reference_row(s, **rowp)
                    kind[b, h, i] = rt.kind
                    zbar[b, h, i] = rt.zbar
                    for j in range(nvis):
                        zabs[b, h, i, j] = rt.zabs[j]
                        w[b, h, i, j] = float(rt.y[j]) if rt.y[j] is not None else np.nan
                    live = [j for j in range(nvis) if rt.y[j] is not None and rt.y[j] != 0]
                    for e in range(dv_):
                        if rt.kind == ROW_NAN:
                            split_double(None, out_hi, out_lo, (b, h, i, e))
                            continue
                        if rt.kind == ROW_MASKED:
                            out_zero[b, h, i, e] = True
                            continue
                        o = mpmath.fsum(rt.y[j] * V[j][e] for j in live)
                        split_double(o, out_hi, out_lo, (b, h, i, e))
                        nan_ok[b, h, i, e] = any(bad_v[j, e] for j in range(lk)
                                                 if j not in live)
                    if not grads:
                        continue
                    if rt.kind == ROW_NAN:
                        touched_q[i] = True
                        for j in range(nvis):
                            DK[j] = [mpmath.nan] * k.shape[3]
                            DV[j] = [mpmath.nan] * dv_
                            touched_k[j] = touched_v[j] = True
                        DQ[i] = [mpmath.nan] * q.shape[3]
                        for p in dpar:
                            p.append(mpmath.nan)
                        continue
                    g = [mpmath.fdot(DO[i], V[j]) if j in live else zero for j in range(nvis)]
                    rg = fn.row.gradient_row(s, g, **rowp)
                    for j in live:  # dv_j += w_ij dO_i (the +inf limit included)
                        touched_v[j] = True
                        DV[j] = [a + rt.y[j] * d for a, d in zip(DV[j], DO[i], strict=True)]
                    for n, name in enumerate(fn.row_params):
                        dpar[n].append(rg.dparams[name])
                    for j in live:  # exactly 0 by structure only where nothing is kept
                        touched_q[i] = touched_k[j] = True
                    for j in range(nvis):
                        ds = rg.dx[j]
                        if rg.zero[j] or ds == 0:
                            continue
                        DQ[i] = [a + sc * ds * kk for a, kk in zip(DQ[i], K[j], strict=True)]
                        DK[j] = [a + sc * ds * qq for a, qq in zip(DK[j], Q[i], strict=True)]
                if not grads:
                    continue
                for i in range(lq):
                    dzq[b, h, i] = not touched_q[i]
                    for d in range(q.shape[3]):
                        split_double(DQ[i][d], dq_hi, dq_lo, (b, h, i, d))
                for j in range(lk):
                    dzk[b, h, j] = not touched_k[j]
                    dzv[b, h, j] = not touched_v[j]
                    for d in range(k.shape[3]):
                        split_double(DK[j][d], dk_hi, dk_lo, (b, h, j, d))
                    for e in range(dv_):
                        split_double(DV[j][e], dv_hi, dv_lo, (b, h, j, e))
                for n in range(npar):
                    vals = dpar[n]
                    total = (None if any(x is None for x in vals)
                             else mpmath.fsum(vals) if vals else zero)
                    split_double(total, dp_hi, dp_lo, (b, h, n))
    return AttentionTruth(out_hi.astype(f64), out_lo, out_zero, nan_ok, w, zabs, zbar, kind,
                          dq_hi, dq_lo, dk_hi, dk_lo, dv_hi, dv_lo, dzq, dzk, dzv, dp_hi,
                          dp_lo, grad_nan_ok)


def truth_key(fn: AttentionFunction, params: dict[str, float], arrays: list[np.ndarray],
              scale: float, precision: int) -> str:
    """A content hash of the question: function, params, scale, precision, input bytes."""
    h = hashlib.sha256()
    meta = [ATTENTION_TRUTH_VERSION, fn.name, sorted(params.items()), scale, precision,
            [list(a.shape) for a in arrays]]
    h.update(json.dumps(meta).encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return h.hexdigest()


def cached_evaluate(directory: Path | None, fn: AttentionFunction, params: dict[str, float],
                    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                    dout: np.ndarray | None, precision: int) -> AttentionTruth:
    """evaluate, through the truths' content-addressed disk cache (None: no disk)."""
    arrays = [q, k, v] + ([dout] if dout is not None else [])
    key = truth_key(fn, params, arrays, scale, precision) + "-attention"
    store = TruthStore(directory)
    truth = store.get(key, AttentionTruth)  # type: ignore[arg-type]
    if truth is None:
        truth = evaluate(fn, params, q, k, v, scale, dout, precision)
        store.put(key, truth)  # type: ignore[arg-type]
    return truth  # type: ignore[return-value]
