"""The certified phase for the weight-normalize members in attention: symax and stablemax.

    w_j = a(s_j) / D,   D = eta + sum_visible a(s)      (symax: a = |s|; stablemax: a = st(s),
                                                        st = s + 1 for s >= 0, 1/(1 - s) below)

on the scores of numerics/certified/attention_forward.py (double-doubles with absolute bounds).
Both `a` are 1-Lipschitz on the whole line, so a score's bound passes to `a(s)` whichever
branch its computed value takes; `a'` is symax's sign(s) (0 at an exact 0; a row with a
score within its bound of 0 but not exactly 0 goes to mpmath) and stablemax's 1 or
1/(1 - s)^2, 2-Lipschitz. Gradients (numerics/certified/attention_grad.py):
ds_j = a'(s_j) (g_j - c) / D, d eta = -c / D (docs/numerics.md section 7.5).
"""

from __future__ import annotations

import math

import numpy as np

from elasticbench.harness.functions import AttentionFunction
from elasticbench.harness.functions.definition import ROW_FINITE, ROW_MASKED, ROW_NAN
from elasticbench.harness.numerics.certified import dd
from elasticbench.harness.numerics.certified.bounded_dd import (
    Bdd,
    Scores,
    Weights,
    badd,
    bmul,
    bsum,
)
from elasticbench.harness.numerics.certified.bounds import SLACK
from elasticbench.harness.numerics.certified.rows_grad import floor_of

MEMBERS = ("symax", "stablemax")
OFFSET_MAX = 2.0**900  # eta up to this: D and every product stay in range


def fits(fn: AttentionFunction, params: dict[str, float]) -> bool:
    """Whether this phase evaluates fn's weights at these parameters."""
    if fn.row.name not in MEMBERS or not fn.normalized:
        return False
    eta = fn.row.weight_offset(params)
    return math.isfinite(eta) and 0 <= eta < OFFSET_MAX


def _reciprocal(t: Bdd) -> tuple[Bdd, np.ndarray]:
    """1/t for t with t.h - t.b > 0, with its bound, and where that holds."""

    low = t.h - t.b
    ok = low > 0
    safe_h, safe_l = np.where(ok, t.h, 1.0), np.where(ok, t.l, 0.0)
    rh, rl = dd.div(np.ones_like(safe_h), np.zeros_like(safe_h), safe_h, safe_l)
    lo = np.where(ok, low, 1.0)
    b = t.b / (lo * lo) + np.abs(rh) * dd.DIV_DD * dd.U2 + floor_of(rh)
    return Bdd(rh, rl, SLACK * b), ok


def _shape(name: str, s: Bdd) -> tuple[Bdd, Bdd, np.ndarray]:
    """a(s) and a'(s) with their bounds, and where a'(s) is known (symax: the sign)."""

    if name == "symax":
        neg = s.h < 0
        a = Bdd(np.abs(s.h), np.where(neg, -s.l, s.l), s.b.copy())
        exact0 = (s.h == 0) & (s.b == 0)
        known = exact0 | (np.abs(s.h) > s.b)
        sign = np.where(exact0, 0.0, np.where(neg, -1.0, 1.0))
        return a, Bdd.exact(sign), known
    one = Bdd.exact(np.ones_like(s.h))
    pos = s.h >= 0
    up = badd(s, one)  # s + 1
    t = badd(one, -Bdd(np.minimum(s.h, 0.0), np.where(pos, 0.0, s.l), s.b))  # 1 - s >= 1
    r, _ = _reciprocal(t)
    r2 = bmul(r, r)
    a = Bdd(np.where(pos, up.h, r.h), np.where(pos, up.l, r.l), np.where(pos, up.b, r.b))
    near = np.abs(s.h) <= s.b  # the other branch's a' within 2 s.b (a' is 2-Lipschitz)
    slope = Bdd(np.where(pos, 1.0, r2.h), np.where(pos, 0.0, r2.l),
                np.where(pos, np.where(near, 2 * s.b, 0.0), r2.b))
    return a, slope, np.ones(s.h.shape, dtype=bool)


def weights(fn: AttentionFunction, params: dict[str, float], sc: Scores) -> Weights:
    """The weights a(s)/D of each query row of sc, with bounds; a'(s) and 1/D for the
    gradients (Weights.slope, Weights.inv)."""

    eta = fn.row.weight_offset(params)
    n = sc.s.h.shape[0]
    a, slope, known = _shape(fn.row.name, sc.s)
    live = sc.visible & ~sc.nan_row[:, None]
    kept = live & ((a.h != 0) | (a.b != 0))  # symax's exact 0 scores weigh exactly 0
    a, slope = a.where(kept), slope.where(kept)
    den = bsum(a)
    if eta:
        den = badd(den, Bdd.exact(np.full(n, eta)))
    finite = (kept.any(axis=1) | (eta > 0)) & ~sc.nan_row
    kind = np.where(sc.nan_row, ROW_NAN, np.where(finite, ROW_FINITE, ROW_MASKED)).astype("U8")
    inv, positive = _reciprocal(den)
    dh = np.where(positive, den.h, 1.0)
    yh, yl = dd.div(a.h, a.l, dh[:, None], np.where(positive, den.l, 0.0)[:, None])
    low = np.where(positive, den.h - den.b, 1.0)[:, None]
    by = ((a.b + np.abs(yh) * den.b[:, None]) / low + np.abs(yh) * dd.DIV_DD * dd.U2
          + floor_of(yh, a.h))
    y = Bdd(yh, yl, SLACK * by).where(kept)
    share = Bdd.exact(np.zeros(n)) if not eta else Bdd(
        *dd.div(np.full(n, eta), np.zeros(n), dh, np.where(positive, den.l, 0.0)),
        SLACK * (eta * den.b / np.where(positive, den.h - den.b, 1.0) ** 2
                 + eta / dh * dd.DIV_DD * dd.U2)).where(finite)
    top = np.argmax(np.where(kept, y.h, -np.inf), axis=1)
    zeros = Bdd.exact(np.zeros(kept.shape))
    trusted = (sc.trusted & (known | ~live).all(axis=1) & (positive | ~finite)
               & np.isfinite(den.h))
    return Weights(y, zeros, inv.where(finite), share, Bdd.exact(np.zeros(n)), kept, top,
                   kind, np.zeros(kept.shape), np.zeros(n), np.zeros(n), trusted,
                   slope=slope, inv=inv.where(finite))
