"""The attention oracle: exact outputs and gradients in mpmath, per query row or per head.

The scores s_ij = scale * q_i . k_j are formed exactly (mpmath at `precision` bits from the
exact inputs), each query's weights are its row function's exact reference over the keys it
sees (functions/), and out_i = sum_j w_ij v_j is summed exactly. The gradients for an
upstream dO are the row function's exact gradients (AttentionFunction.gradient_row) with
g_j = dO_i . v_j (docs/attention.md sections 2 and 9), carried to q, k and v, and summed over
the queries for the row parameters. A NaN query of a normalized weight makes everything it
reaches NaN; sigmoid's weights are each alone, so a NaN score there makes NaN only what
that weight reaches (dq_i, dk_j, dv_j and the bias). Cog's weights are signed: a zero score
weighs 0 in out and dv but its ds = p g is not 0 (functions/cog.py).

This is the accurate phase of the attention reference (numerics/truth/attention_truth.py): it
answers the query rows (forward) and the heads (gradients) that the certified phase
(numerics/certified/attention_forward.py) leaves, and it is the oracle the certified phase is
tested against (tests/harness/reference/test_certified_attention.py). Its results are
written into an AttentionTruth in place, as double-doubles (truth/row_truth.py
split_double).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mpmath
import numpy as np

from elasticbench.harness.functions import AttentionFunction
from elasticbench.harness.functions.definition import ROW_MASKED, ROW_NAN, RowTruth
from elasticbench.harness.numerics.truth.row_truth import split_double

if TYPE_CHECKING:
    from elasticbench.harness.numerics.truth.attention_values import AttentionTruth


def _mp(a: np.ndarray) -> list:
    return [[mpmath.mpf(float(x)) for x in row] for row in a]


SPREAD_BITS = 4096  # the widest span of exponents _dot sums in one integer


def _parts(x: Any) -> tuple[int, int] | None:
    """An mpf as (m, e), value m 2^e with m an int (0 for zero); None for NaN and inf."""
    sign, man, exp, bc = x._mpf_
    if not man:
        return (0, 0) if bc == 0 else None
    return (-int(man) if sign else int(man), int(exp))


def _parts_rows(rows: list) -> list:
    return [[_parts(x) for x in row] for row in rows]


def _dot(pairs: Iterable[tuple[Any, Any]]) -> Any:
    """The sum of the products of the given (m, e) pairs of _parts: exact in integers,
    rounded once to the working precision (mpmath.fdot's value, at a fraction of its cost);
    None where a part is NaN or inf, or the exponents span more than SPREAD_BITS (the
    caller takes fdot)."""
    terms = []
    for pa, pb in pairs:
        if pa is None or pb is None:
            return None
        if pa[0] and pb[0]:
            terms.append((pa[0] * pb[0], pa[1] + pb[1]))
    if not terms:
        return mpmath.mpf(0)
    e0, e1 = min(e for _, e in terms), max(e for _, e in terms)
    if e1 - e0 > SPREAD_BITS:  # (an mpf's exponent is unbounded): fdot sums those
        return None
    return mpmath.mpf((sum(m << (e - e0) for m, e in terms), e0))


def exact_dot(a: list, b: list, pa: list, pb: list) -> Any:
    """sum_n a_n b_n for mpf lists a, b (pa, pb their _parts), rounded once."""
    value = _dot(zip(pa, pb, strict=True))
    return mpmath.fdot(a, b) if value is None else value


@dataclass
class Head:
    """One (batch, head) of the inputs in mpmath, and what its query rows share."""

    b: int
    h: int
    Q: list
    K: list
    V: list
    bad_v: np.ndarray  # (Lk, Dv) bool: v not finite
    sc: Any  # the scale as an mpf
    causal: bool
    bias: np.ndarray | None = None  # (Lq, Lk) a mask's: -inf hides a key, else added
    DO: list = field(default_factory=list)  # the upstream gradient (gradient_heads sets it)
    parts: dict[str, list] = field(default_factory=dict)  # Q, K, V, DO as _parts
    # query i: (the keys it sees, its scores over them, its row truth, the positions among
    # them of its live keys)
    rows: dict[int, tuple[list[int], list, RowTruth, list[int]]] = field(default_factory=dict)

    def keys(self, i: int) -> list[int]:
        """The keys query i sees: causally the first i + 1, less those the mask hides."""
        n = min(i + 1, len(self.K)) if self.causal else len(self.K)
        if self.bias is None:
            return list(range(n))
        return [j for j in range(n) if self.bias[i, j] != -np.inf]

    def part(self, name: str) -> list:
        """Q, K, V (or DO, once set) as _parts, made once."""
        if name not in self.parts:
            self.parts[name] = _parts_rows(getattr(self, name))
        return self.parts[name]

    def score(self, i: int, j: int) -> Any:
        """s_ij exactly: scale q_i . k_j, plus the mask's finite value."""
        s = self.sc * exact_dot(self.Q[i], self.K[j], self.part("Q")[i], self.part("K")[j])
        return s if self.bias is None else s + mpmath.mpf(float(self.bias[i, j]))


def _head(q: np.ndarray, k: np.ndarray, v: np.ndarray, b: int, h: int, scale: float,
          causal: bool, bias: np.ndarray | None) -> Head:
    return Head(b, h, _mp(q[b, h]), _mp(k[b, h]), _mp(v[b, h]), ~np.isfinite(v[b, h]),
                mpmath.mpf(float(scale)), causal, None if bias is None else bias[b, h])


def _forward_row(truth: AttentionTruth, fn: AttentionFunction, rowp: dict[str, float],
                 head: Head, i: int) -> None:
    """Query i of a head: its scores, its row's exact weights, out_i; kept in head.rows."""
    b, h, keys = head.b, head.h, head.keys(i)
    s = [head.score(i, j) for j in keys]
    rt = fn.row.reference_row(s, **rowp)
    truth.kind[b, h, i] = rt.kind
    truth.zbar[b, h, i] = rt.zbar
    ys, zabs = rt.y, rt.zabs  # (each a list built per call: built once here)
    for p, j in enumerate(keys):
        truth.zabs[b, h, i, j] = zabs[p]
        truth.w[b, h, i, j] = float(ys[p]) if ys[p] is not None else np.nan
    live = [p for p in range(len(keys)) if ys[p] is not None and ys[p] != 0]
    head.rows[i] = (keys, s, rt, live)
    live_keys = {keys[p] for p in live}
    for e in range(head.bad_v.shape[1]):
        if rt.kind == ROW_NAN:
            split_double(None, truth.out_hi, truth.out_lo, (b, h, i, e))
            continue
        if rt.kind == ROW_MASKED:
            truth.out_zero[b, h, i, e] = True
            continue
        o = mpmath.fsum(ys[p] * head.V[keys[p]][e] for p in live)
        split_double(o, truth.out_hi, truth.out_lo, (b, h, i, e))
        truth.out_nan_ok[b, h, i, e] = any(head.bad_v[j, e] for j in range(len(head.K))
                                           if j not in live_keys)


def forward_rows(truth: AttentionTruth, fn: AttentionFunction, params: dict[str, float],
                 q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                 rows: Iterable[tuple[int, int, int]], precision: int,
                 bias: np.ndarray | None = None) -> None:
    """The exact forward of the given query rows (b, h, i), written into truth; bias
    (B, H, Lq, Lk) a mask's, or None."""
    heads: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b, h, i in rows:
        heads[(b, h)].append(i)
    rowp = {n: params[n] for n in fn.row_params}
    causal = bool(params.get("causal", 0.0))
    with mpmath.workprec(precision):
        for (b, h), queries in heads.items():
            head = _head(q, k, v, b, h, scale, causal, bias)
            for i in queries:
                _forward_row(truth, fn, rowp, head, i)


@dataclass
class Accumulators:
    """A head's gradient terms as its queries give them (each gradient summed once, at the
    end, by one fdot), which gradients are NaN, and what each query reached."""

    terms_q: list[list]  # per query i: (ds_ij, j) for every nonzero ds_ij
    terms_k: list[list]  # per key j: (ds_ij, i)
    terms_v: list[list]  # per key j: (w_ij, i) for every live weight
    nan_q: np.ndarray  # bool: the gradient is NaN whatever its terms
    nan_k: np.ndarray
    nan_v: np.ndarray
    touched_q: np.ndarray
    touched_k: np.ndarray
    touched_v: np.ndarray
    dpar: list[list]

    @classmethod
    def zeros(cls, lq: int, lk: int, npar: int) -> Accumulators:
        return cls([[] for _ in range(lq)], [[] for _ in range(lk)], [[] for _ in range(lk)],
                   np.zeros(lq, bool), np.zeros(lk, bool), np.zeros(lk, bool),
                   np.zeros(lq, bool), np.zeros(lk, bool), np.zeros(lk, bool),
                   [[] for _ in range(npar)])


def _nan_row(acc: Accumulators, i: int, keys: list[int]) -> None:
    """A NaN query: its dq, the dk and dv of every key it sees and the parameters are NaN."""
    acc.touched_q[i] = acc.nan_q[i] = True
    for j in keys:
        acc.nan_k[j] = acc.nan_v[j] = acc.touched_k[j] = acc.touched_v[j] = True
    for p in acc.dpar:
        p.append(mpmath.nan)


def _gradient_row(acc: Accumulators, fn: AttentionFunction, rowp: dict[str, float],
                  head: Head, DO: list, i: int) -> None:
    """Query i's share of the head's gradients: ds = the row gradient for g_j = dO_i . v_j."""
    keys, s, rt, live = head.rows[i]
    if rt.kind == ROW_NAN and fn.normalized:
        _nan_row(acc, i, keys)
        return
    zero = mpmath.mpf(0)
    pdo, pv = head.part("DO")[i], head.part("V")
    # a signed weight's zero (a zero score) still has a gradient, p g (functions/cog.py):
    # its g is formed too where v_j is finite
    fed = set(live) if not fn.signed else {p for p, j in enumerate(keys)
                                           if p in live or not head.bad_v[j].any()}
    g = [exact_dot(DO[i], head.V[j], pdo, pv[j]) if p in fed else zero
         for p, j in enumerate(keys)]
    rg = fn.gradient_row(s, g, **rowp)
    ys = rt.y
    for p in live:  # dv_j += w_ij dO_i (the +inf limit included)
        j = keys[p]
        acc.touched_v[j] = True
        acc.terms_v[j].append((ys[p], i))
    for n, name in enumerate(fn.row_params):
        acc.dpar[n].append(rg.dparams[name])
    for p in live:  # exactly 0 by structure only where nothing is kept
        acc.touched_q[i] = acc.touched_k[keys[p]] = True
    for p, j in enumerate(keys):
        ds = rg.dx[p]
        if ds is None:  # an elementwise weight's NaN (sigmoid): its key's dk, dv and dq_i
            acc.nan_q[i] = acc.nan_k[j] = acc.nan_v[j] = True
            acc.touched_q[i] = acc.touched_k[j] = acc.touched_v[j] = True
            continue
        if rg.zero[p] or ds == 0:
            continue
        acc.touched_q[i] = acc.touched_k[j] = True  # (a signed weight's zero moves them)
        acc.terms_q[i].append((ds, j))
        acc.terms_k[j].append((ds, i))


def _sum(terms: list, rows: list, parts: list, d: int, factor) -> mpmath.mpf:
    """factor * sum of t * rows[n][d] over the (t, n) of terms, summed exactly and rounded
    once (fdot where a value is NaN or inf; 0 for no term)."""
    if not terms:
        return mpmath.mpf(0)
    value = _dot((_parts(t), parts[n][d]) for t, n in terms)
    if value is None:
        value = mpmath.fdot((t, rows[n][d]) for t, n in terms)
    return factor * value


def _store_gradients(truth: AttentionTruth, head: Head, acc: Accumulators, DO: list) -> None:
    """The head's summed gradients into truth, with what nothing reached (exactly 0):
    dq_i = scale sum_j ds_ij k_j, dk_j = scale sum_i ds_ij q_i, dv_j = sum_i w_ij dO_i."""
    b, h, sc, one = head.b, head.h, head.sc, mpmath.mpf(1)
    nan = mpmath.nan  # stored as before: hi NaN, lo 0
    for i, terms in enumerate(acc.terms_q):
        truth.dzero_q[b, h, i] = not acc.touched_q[i]
        for d in range(len(head.Q[i])):
            value = nan if acc.nan_q[i] else _sum(terms, head.K, head.part("K"), d, sc)
            split_double(value, truth.dq_hi, truth.dq_lo, (b, h, i, d))
    for j in range(len(acc.terms_k)):
        truth.dzero_k[b, h, j] = not acc.touched_k[j]
        truth.dzero_v[b, h, j] = not acc.touched_v[j]
        for d in range(len(head.K[j])):
            value = nan if acc.nan_k[j] else _sum(acc.terms_k[j], head.Q, head.part("Q"),
                                                   d, sc)
            split_double(value, truth.dk_hi, truth.dk_lo, (b, h, j, d))
        for e in range(len(head.V[j])):
            value = nan if acc.nan_v[j] else _sum(acc.terms_v[j], DO, head.part("DO"), e,
                                                   one)
            split_double(value, truth.dv_hi, truth.dv_lo, (b, h, j, e))
    for n, vals in enumerate(acc.dpar):
        total = (None if any(x is None for x in vals)
                 else mpmath.fsum(vals) if vals else mpmath.mpf(0))
        split_double(total, truth.dp_hi, truth.dp_lo, (b, h, n))


def gradient_heads(truth: AttentionTruth, fn: AttentionFunction, params: dict[str, float],
                   q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray, scale: float,
                   heads: Iterable[tuple[int, int]], precision: int,
                   bias: np.ndarray | None = None) -> None:
    """The exact forward and gradients of the given heads (b, h), written into truth; bias
    (B, H, Lq, Lk) a mask's, or None."""
    rowp = {n: params[n] for n in fn.row_params}
    causal = bool(params.get("causal", 0.0))
    lq, lk = q.shape[2], k.shape[2]
    with mpmath.workprec(precision):
        for b, h in heads:
            head = _head(q, k, v, b, h, scale, causal, bias)
            for i in range(lq):
                _forward_row(truth, fn, rowp, head, i)
            DO = _mp(dout[b, h])
            head.DO = DO
            acc = Accumulators.zeros(lq, lk, len(fn.row_params))
            for i in range(lq):
                _gradient_row(acc, fn, rowp, head, DO, i)
            _store_gradients(truth, head, acc, DO)
