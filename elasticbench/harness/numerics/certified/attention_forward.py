"""The certified phase of the attention reference: double-double with a bound on every value.

For each query row the scores s_ij = scale * q_i . k_j are double-double dot products
(error-free products, a pairwise sum, one product by the scale) with a proven absolute bound
E_ij. The row function's weights are evaluated on those scores in the shifted form of
numerics/certified/rows_forward.py, with the score bounds carried through the exponential; then
out_i = sum_j w_ij v_j is a double-double dot product with its bound (docs/numerics.md
section 6.5 derives every term). A query row is taken when every output of it is certified
by the rows' rule (bounds.certify: within 2^-12 ulp of the format and inside one binade);
the others go to the mpmath oracle (numerics/truth/attention_oracle.py), whole. The gradients
are numerics/certified/attention_grad.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from elasticbench.harness.functions import AttentionFunction
from elasticbench.harness.functions.definition import ROW_FINITE, ROW_MASKED, ROW_NAN
from elasticbench.harness.numerics.certified import dd
from elasticbench.harness.numerics.certified import normalize as certified_normalize
from elasticbench.harness.numerics.certified.bounded_dd import (
    Bdd,
    Scores,
    Weights,
    badd,
    bdiv_d,
    bmul_d,
    bsum,
    dot,
)
from elasticbench.harness.numerics.certified.bounds import SLACK, TAU_RANGE, Bounded, certify
from elasticbench.harness.numerics.certified.edges import tiny_slack, top_values
from elasticbench.harness.numerics.certified.rows_grad import floor_of
from elasticbench.harness.numerics.dtypes import FloatFormat

if TYPE_CHECKING:
    from elasticbench.harness.numerics.truth.attention_values import AttentionTruth

INPUT_MAX = 2.0**480  # finite inputs up to this: every product and dot product stays in range
SCORE_MIN = 2.0**-900  # a kept score nonzero below this has an inaccurate lo part: mpmath
ARG_MAX = 2.0**-60  # the largest error of an exponent's argument the bounds are derived for


# ---------------------------------------------------------------------------------------
# Scores


def _in_range(x: np.ndarray) -> np.ndarray:
    """Per vector (last axis): every element finite and within INPUT_MAX."""
    return (np.isfinite(x) & (np.abs(x) <= INPUT_MAX)).all(axis=-1)


def _not_big(x: np.ndarray) -> np.ndarray:
    """Per vector (last axis): no finite element beyond INPUT_MAX."""
    return (~np.isfinite(x) | (np.abs(x) <= INPUT_MAX)).all(axis=-1)


def scores(q: np.ndarray, k: np.ndarray, scale: float, visible: np.ndarray,
           add: np.ndarray | None = None) -> Scores:
    """Scores of the query rows q (r, D) over the keys k (r, n, D) (each row's own keys),
    plus add (r, n), a finite float mask's exact doubles, where one is given.
    A NaN score is found in IEEE arithmetic, which agrees with mpmath's where no finite
    product can overflow (a NaN or inf * 0 in the inputs, inf - inf among the products)."""
    qs, ks = np.nan_to_num(q, nan=0.0, posinf=0.0, neginf=0.0), np.nan_to_num(
        k, nan=0.0, posinf=0.0, neginf=0.0)
    t = dot(qs[:, None, :], ks)
    s = bmul_d(t, scale)
    if add is not None:
        s = badd(s, Bdd.exact(add))
    s.b *= SLACK
    with np.errstate(invalid="ignore", over="ignore"):
        plain = np.einsum("rd,rnd->rn", q, k)
        tiny = (s.h != 0) & (np.abs(s.h) < SCORE_MIN) & visible
    nan_row = ((np.isnan(plain) & visible).any(axis=1) & _not_big(q)
               & (_not_big(k) | ~visible).all(axis=1))
    finite = _in_range(q) & (_in_range(k) | ~visible).all(axis=1)
    trusted = (finite & ~tiny.any(axis=1)) | nan_row
    return Scores(s.where(visible), visible, nan_row, trusted)


# ---------------------------------------------------------------------------------------
# The row function on the scores


def _shift(sc: Scores, kept: np.ndarray, k: np.ndarray) -> tuple[Bdd, np.ndarray, np.ndarray]:
    """The shift m per row (the largest kept score, as a dd; its bound), the key it is the
    score of, and the keys known to tie it exactly (equal key vectors give equal scores)."""
    sh = np.where(kept, sc.s.h, -np.inf)
    mh = sh.max(axis=1, initial=-np.inf)
    at = kept & (sc.s.h == mh[:, None])
    ml = np.where(at, sc.s.l, -np.inf).max(axis=1, initial=-np.inf)
    top = np.argmax(at & (sc.s.l == ml[:, None]), axis=1)
    rows = np.arange(len(top))
    m = sc.s[rows, top].where(kept.any(axis=1))
    same = (k == k[rows, top][:, None, :]).all(axis=2) & kept
    return m, top, same


def _exponentials(sc: Scores, kept: np.ndarray, m: Bdd, same: np.ndarray, tau: float
                  ) -> tuple[Bdd, Bdd]:
    """z = (s - m)/tau with its absolute bound (the scores', the subtraction's and the
    division's; 0 at the exact ties of the top, where z = 0), and e = exp(z) with its
    relative bound (in e.b): the argument's error, first order (it is below ARG_MAX where
    the row is trusted), plus the exponential's own."""
    z = bdiv_d(badd(sc.s, -m[:, None]), tau)
    z = Bdd(z.h, z.l, np.where(same, 0.0, SLACK * z.b)).where(kept)
    eh, el = dd.exp(z.h, z.l)
    e = Bdd(eh, el, z.b * (1 + 2 * ARG_MAX) + dd.EXP_REL).where(kept)
    return z, e


def _offset_term(m: Bdd, tau: float) -> tuple[Bdd, Bdd, np.ndarray]:
    """m/tau and exp(-m/tau), each with an absolute bound, and the relative bound of the
    exponential alone (inf where m < 0: exp(-m/tau) is not evaluated there)."""
    mt = bdiv_d(m, tau)
    mt.b = SLACK * mt.b
    neg = mt.h < 0
    eh, el = dd.exp(np.where(neg, 0.0, -mt.h), np.where(neg, 0.0, -mt.l))
    rel = np.where(neg, np.inf, mt.b * (1 + 2 * ARG_MAX) + dd.EXP_REL)
    cut = np.where(mt.h > -dd.EXP_MIN, 2.0**-1096, 0.0)  # exp(-m/tau) below 2^-1096, read 0
    return mt, Bdd(eh, el, np.abs(eh) * rel + dd.EXP_ABS + cut), rel


@dataclass
class Denominator:
    """Each row's S = sum_kept exp(z) + offset exp(-m/tau) (1 outside finite rows), its
    relative bound, and the offset term's value."""

    h: np.ndarray
    l: np.ndarray  # noqa: E741
    eps: np.ndarray
    offset_h: np.ndarray


def _denominator(e: Bdd, e0: Bdd, rel0: np.ndarray, offset: float, finite: np.ndarray
                 ) -> Denominator:
    """S summed pairwise: the terms' relative bounds weighted by their shares, a dd addition
    per level, and every exponential's absolute floor (EXP_ABS, a cut one's 2^-1096)."""
    n = e.h.shape[1]
    ch, cl = dd.mul_d(e0.h, e0.l, offset)
    sh, sl = dd.sum_rows(e.h, e.l)
    s_h, s_l = dd.add(sh, sl, ch, cl)
    s_h, s_l = np.where(finite, s_h, 1.0), np.where(finite, s_l, 0.0)  # S >= 1 where finite
    term = np.where(ch != 0, ch * (rel0 + dd.MUL_D * dd.U2), 0.0)  # (rel0 is inf for m < 0)
    eps = (((e.h * e.b).sum(axis=1) + term) / s_h
           + (dd.depth(n) + 1) * dd.ADD_DD * dd.U2 + (n + 1 + offset) * dd.EXP_ABS / s_h)
    return Denominator(s_h, s_l, eps, ch)


def weights(fn: AttentionFunction, params: dict[str, float], sc: Scores, k: np.ndarray
            ) -> Weights:
    """The row function's weights on the scores of sc (k: each row's keys, for the ties),
    by the shifted form y_j = exp(z_j) / S, S = sum_kept exp(z) + offset exp(-m/tau)."""
    if certified_normalize.fits(fn, params):
        return certified_normalize.weights(fn, params, sc)
    if fn.signed:
        return signed_weights(fn, params, sc, k)
    return _exp_weights(fn, params, sc, k)


def signed_weights(fn: AttentionFunction, params: dict[str, float], sc: Scores,
                   k: np.ndarray) -> Weights:
    """Cog's weights sign(s_j) p_j, p = softmax(|s|) over the visible keys
    (functions/cog.py): |s| is exact on the score's double-double (its bound unchanged), so
    p is the exp family's weight at tau = 1 on |s| with its bound, and the sign is exact
    where the score is known to be nonzero or is exactly 0 (bound 0); a row with a score
    within its bound of 0 but not exactly 0 is left to mpmath. `kept` is then the keys of
    nonzero weight (a zero score weighs 0: a non-finite v there reaches nothing)."""
    neg = sc.s.h < 0
    a = Scores(Bdd(np.abs(sc.s.h), np.where(neg, -sc.s.l, sc.s.l), sc.s.b), sc.visible,
               sc.nan_row, sc.trusted)
    w = _exp_weights(fn, params, a, k)
    exact0 = (sc.s.h == 0) & (sc.s.b == 0)
    known = exact0 | (np.abs(sc.s.h) > sc.s.b)
    sign = np.where(exact0, 0.0, np.where(neg, -1.0, 1.0))
    w.y = Bdd(sign * w.y.h, sign * w.y.l, np.where(exact0, 0.0, w.y.b))
    w.kept = w.kept & (sign != 0)
    w.trusted = w.trusted & (known | ~sc.visible).all(axis=1)
    return w


def _exp_weights(fn: AttentionFunction, params: dict[str, float], sc: Scores, k: np.ndarray
                 ) -> Weights:
    """weights' exp family: the shifted form (the row function's keep, temperature and
    offset)."""
    row = fn.row
    tau, offset = row.temperature(params), row.offset(params)
    with np.errstate(invalid="ignore"):
        kept = sc.visible & np.asarray(row.kept(sc.s.h), bool) & ~sc.nan_row[:, None]
        sure = (np.asarray(row.kept(sc.s.h - sc.s.b)) == np.asarray(row.kept(sc.s.h + sc.s.b)))
    m, top, same = _shift(sc, kept, k)
    finite = kept.any(axis=1) & ~sc.nan_row
    kind = np.where(sc.nan_row, ROW_NAN, np.where(finite, ROW_FINITE, ROW_MASKED)).astype("U8")
    z, e = _exponentials(sc, kept, m, same, tau)
    mt, e0, rel0 = _offset_term(m, tau)
    den = _denominator(e, e0, rel0, offset, finite)
    yh, yl = dd.div(e.h, e.l, den.h[:, None], den.l[:, None])
    zabs = np.where(kept, np.abs(z.h), 0.0)
    by = SLACK * (np.abs(yh) * (e.b + den.eps[:, None] + dd.DIV_DD * dd.U2)
                  + tiny_slack(e.h, yh, zabs))
    y = Bdd(yh, yl, by).where(kept)
    bounded = Bounded(y.h, y.l, y.b, ~kept, zabs, np.zeros(len(kind)), kind, finite,
                      np.zeros(kept.shape, dtype=bool), np.zeros(kept.shape, dtype=bool))
    top_values(same, kept, np.where(same, 0.0, e.h).sum(axis=1) + den.offset_h, den.h, offset,
               bounded)  # the top keys' 1/c - gap, in place
    qh, ql = dd.div(e0.h, e0.l, den.h, den.l)
    q0 = Bdd(qh, ql, SLACK * (e0.b / den.h + np.abs(qh) * (den.eps + dd.DIV_DD * dd.U2))
             + floor_of(qh))
    share = bmul_d(q0, offset) if offset else Bdd.exact(np.zeros(len(kind)))  # (q0.b may be inf)
    trusted = (sc.trusted & (sure | ~sc.visible).all(axis=1)
               & (np.where(kept, z.b, 0.0).max(axis=1, initial=0.0) <= ARG_MAX)
               & ((mt.b <= ARG_MAX) & ((offset == 0) | (mt.h >= 0)) | ~finite)
               & row_function_fits(fn, params))
    zbar, zbar_bound = _zbar(y, z, share, mt)
    return Weights(y, z, q0, share, mt, kept, top, kind, zabs, np.where(finite, zbar, 0.0),
                   np.where(finite, zbar_bound, 0.0), trusted)


def row_function_fits(fn: AttentionFunction, params: dict[str, float]) -> bool:
    """Whether the row function is an exp-normalize member this phase evaluates (shift by
    the largest kept score) at parameters inside the safe range of
    numerics/certified/rows_forward.py.
    The weight-normalize members are numerics/certified/normalize.py's; softmax1 (its
    floored shift) and sigmoid are declined: mpmath answers for them. Cog (signed) is
    taken forward only (signed_weights); its gradients are mpmath's."""
    if certified_normalize.fits(fn, params):
        return True
    if fn.signed:  # cog: softmax of |s| (signed_weights), no parameter
        return True
    row = fn.row
    tau, offset = row.temperature(params), row.offset(params)
    return (row.normalized and row.weights is None and row.shift_floor == -math.inf
            and TAU_RANGE[0] <= tau <= TAU_RANGE[1] and math.isfinite(offset)
            and 0 <= offset < 2.0**900)


def _zbar(y: Bdd, z: Bdd, share: Bdd, mt: Bdd) -> tuple[np.ndarray, np.ndarray]:
    """sum_j y_j |z_j| + share |m/tau| (the mpmath reference's zbar: the output-weighted
    mean of |z| over the denominator's terms, the offset's included), rounded once, and how
    far it may lie from the oracle's, which sums its own |z_j| rounded to float64."""
    zabs = np.abs(z.h)
    th, tl = dd.mul_d(y.h, y.l, zabs)
    sh, sl = dd.sum_rows(th, tl)
    oh, ol = dd.mul(share.h, share.l, np.abs(mt.h), np.where(mt.h < 0, -mt.l, mt.l))
    zbar = dd.add(sh, sl, oh, ol)[0]
    bound = SLACK * ((y.b * zabs + np.abs(y.h) * (z.b + 2.0**-52 * zabs)).sum(axis=1)
                     + np.abs(mt.h) * share.b + np.abs(share.h) * mt.b + 2.0**-52 * zbar)
    return zbar, bound


# ---------------------------------------------------------------------------------------
# Outputs, and the forward of a block of heads


def outputs(w: Weights, v: np.ndarray) -> tuple[Bdd, np.ndarray, np.ndarray]:
    """out = sum_j y_j v_j per row over its keys' values v (r, n, Dv), with bounds; NaN or
    +-inf, exactly, where a kept key's value is not finite (as mpmath sums them); which
    rows are trusted (no finite value beyond INPUT_MAX where it has weight); and nan_ok,
    where a non-finite value has no weight (a NaN from a kernel is accepted there)."""
    vt = np.swapaxes(v, 1, 2)  # (r, Dv, n)
    live = w.kept[:, None, :]
    finite = np.isfinite(vt)
    usable = finite & (np.abs(vt) <= INPUT_MAX)
    out = bsum(bmul_d(w.y[:, None, :], np.where(usable, vt, 0.0)))
    sv = vt * np.where(w.y.h < 0, -1.0, 1.0)[:, None, :]  # (a negative weight flips inf)
    with np.errstate(invalid="ignore"):
        pos = (live & (sv == np.inf)).any(axis=2)
        neg = (live & (sv == -np.inf)).any(axis=2)
    nan = (live & np.isnan(vt)).any(axis=2) | (pos & neg)
    special = nan | pos | neg
    value = np.where(nan, np.nan, np.where(pos, np.inf, -np.inf))
    out = Bdd(np.where(special, value, out.h), np.where(special, 0.0, out.l),
              np.where(special, 0.0, SLACK * out.b))
    trusted = ~(live & finite & ~usable).any(axis=(1, 2))
    nan_ok = (~live & ~finite).any(axis=2) & (w.kind == ROW_FINITE)[:, None]
    return out, trusted, nan_ok


@dataclass
class Forward:
    """The certified forward of a block of heads, flattened to its query rows."""

    w: Weights
    out: Bdd  # (r, Dv)
    nan_ok: np.ndarray  # (r, Dv)
    visible: np.ndarray  # (r, n)
    trusted: np.ndarray  # (r,) bool: the bounds hold (the row stayed in the safe domain)
    ok: np.ndarray  # (r,) bool: trusted, and every output of the row certified


def visibility(lq: int, lk: int, causal: bool) -> np.ndarray:
    """(Lq, Lk) bool: which keys each query sees (causal: the top-left aligned j <= i)."""
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    return j <= i if causal else np.ones((lq, lk), dtype=bool)


def masked(visible: np.ndarray, bias: np.ndarray | None
           ) -> tuple[np.ndarray, np.ndarray | None]:
    """Visibility under a mask's bias (-inf hides a key) and the finite bias to add (None
    where there is nothing to add: no mask, or a bool mask's zeros)."""
    if bias is None:
        return visible, None
    shown = np.isfinite(bias)
    add = np.where(shown, bias, 0.0)
    return visible & shown, add if add.any() else None


def forward_block(fn: AttentionFunction, params: dict[str, float], q: np.ndarray,
                  k: np.ndarray, v: np.ndarray, scale: float, fmt: FloatFormat,
                  bias: np.ndarray | None = None) -> Forward:
    """The certified forward of g heads: q (g, Lq, D), k (g, Lk, D), v (g, Lk, Dv); bias
    (g, Lq, Lk) a mask's (-inf hides a key, a finite value is added to its score)."""
    g, lq, _ = q.shape
    lk = k.shape[1]
    visible = np.broadcast_to(visibility(lq, lk, bool(params.get("causal", 0.0))),
                              (g, lq, lk))
    visible, add = masked(visible, bias)
    visible = visible.reshape(g * lq, lk)
    head = np.repeat(np.arange(g), lq)
    keys = k[head]
    with np.errstate(all="ignore"):  # masked lanes compute garbage that is never kept
        sc = scores(q.reshape(g * lq, -1), keys, scale, visible,
                    None if add is None else add.reshape(g * lq, lk))
        w = weights(fn, params, sc, keys)
        out, trusted, nan_ok = outputs(w, v[head])
        trusted &= w.trusted
        ok = trusted & ((w.kind != ROW_FINITE) | certify(out.h, out.l, out.b, fmt).all(axis=1))
    return Forward(w, out, nan_ok, visible, trusted, ok)


def write_forward(truth: AttentionTruth, bounds: dict[str, np.ndarray], heads: slice,
                  fw: Forward) -> None:
    """Put a block's forward (heads: its range of flattened (batch, head) pairs) in truth,
    the bounds of out, w, zabs and zbar in bounds."""
    w, lq = fw.w, truth.w.shape[2]
    rows = slice(heads.start * lq, heads.stop * lq)
    flat = {name: getattr(truth, name).reshape(-1, *getattr(truth, name).shape[3:])
            for name in ("out_hi", "out_lo", "out_zero", "out_nan_ok", "w", "zabs", "zbar",
                         "kind")}
    nan, masked = w.kind == ROW_NAN, w.kind == ROW_MASKED
    flat["kind"][rows] = w.kind
    flat["zbar"][rows] = w.zbar
    flat["zabs"][rows] = w.zabs
    flat["w"][rows] = np.where(nan[:, None], np.where(fw.visible, np.nan, 0.0), w.y.h)
    flat["out_hi"][rows] = np.where(nan[:, None], np.nan, fw.out.h)
    flat["out_lo"][rows] = np.where(nan[:, None], np.nan, fw.out.l)
    flat["out_zero"][rows] = masked[:, None]
    flat["out_nan_ok"][rows] = fw.nan_ok
    for name, bound in (("out", fw.out.b), ("w", w.y.b), ("zabs", w.z.b), ("zbar", w.zbar_bound)):
        bounds[name].reshape(-1, *bound.shape[1:])[rows] = bound
