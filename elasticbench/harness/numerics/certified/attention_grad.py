"""The certified phase of the attention gradients: dq, dk, dv, dtau, dbeta with bounds.

For an upstream dO, per query row i of a head (docs/attention.md section 2), on the
certified forward of numerics/certified/attention_forward.py (weights y, z = (s - m)/tau, the
offset's share w and q0 = exp(-m/tau)/S, each with an absolute bound):

    g_j = dO_i . v_j   (kept keys)        c = sum_j g_j y_j
    ds_j = y_j (g_j - c) / tau            dtau_i = sum_j g_j y_j (mean - z_j) / tau
    mean = sum_j y_j z_j - w m/tau        dbeta_i = -c q0
    dq_i = scale sum_j ds_j k_j   dk_j = scale sum_i ds_ij q_i   dv_j = sum_i y_ij dO_i

every product and sum in double-double with its bound carried (bounded_dd.Bdd;
docs/numerics.md section 6.5). For the row's top key k, g_k - c cancels as y_k nears 1, so
it is also formed as sum_{j != k} (g_k - g_j) y_j + g_k w (the same number: 1 - y_k =
sum_{j != k} y_j + w), and the smaller bound kept, as numerics/certified/rows_grad.py does for
rows. A NaN in q, k or v is carried as mpmath carries it (NaN queries make their dq, the dk
and dv of the keys they see and the head's parameters NaN; a NaN value v_j makes g_j NaN).
A head is certified when every dq, dk, dv is (bounds.certify) and each row parameter's
gradient, summed over its queries, is known to CERTIFY_ULP units of the working precision
relative to its size; otherwise the head goes to mpmath.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from elasticbench.harness.functions import AttentionFunction
from elasticbench.harness.functions.definition import (
    DENOMINATOR,
    OFFSET,
    ROW_FINITE,
    ROW_NAN,
    TEMPERATURE,
)
from elasticbench.harness.numerics.certified import dd
from elasticbench.harness.numerics.certified.attention_forward import (
    INPUT_MAX,
    Forward,
    row_function_fits,
)
from elasticbench.harness.numerics.certified.bounded_dd import (
    Bdd,
    Weights,
    badd,
    bdiv_d,
    bmul,
    bmul_d,
    bsum,
    dot,
)
from elasticbench.harness.numerics.certified.bounds import CERTIFY_ULP, SLACK, certify
from elasticbench.harness.numerics.dtypes import FloatFormat, work_format

if TYPE_CHECKING:
    from elasticbench.harness.numerics.truth.attention_values import AttentionTruth


def _swap(x: Bdd) -> Bdd:
    """The last two axes exchanged."""
    return Bdd(np.swapaxes(x.h, -1, -2), np.swapaxes(x.l, -1, -2), np.swapaxes(x.b, -1, -2))


def _at(x: Bdd, idx: np.ndarray) -> Bdd:
    """x[..., idx] along the last axis, one index per row."""
    return Bdd(*(np.take_along_axis(a, idx[..., None], axis=-1)[..., 0] for a in (x.h, x.l, x.b)))


def _dominant_difference(dif: Bdd, g: Bdd, y: Bdd, w: Bdd, top: np.ndarray,
                         kept: np.ndarray) -> None:
    """g_k - c at each row's top key k, replaced (in dif) by sum_{j != k} (g_k - g_j) y_j
    + g_k w where that bound is smaller."""
    gk = _at(g, top)
    others = kept & (np.arange(kept.shape[-1]) != top[..., None])
    u = bmul(badd(gk[..., None], -g), y).where(others)
    alt = badd(bsum(u), bmul(gk, w))
    better = (alt.b < _at(dif, top).b) & kept.any(axis=-1)
    for part, new in ((dif.h, alt.h), (dif.l, alt.l), (dif.b, alt.b)):
        old = np.take_along_axis(part, top[..., None], axis=-1)[..., 0]
        np.put_along_axis(part, top[..., None], np.where(better, new, old)[..., None], axis=-1)


def _dtau(t: Bdd, y: Bdd, z: Bdd, w: Bdd, mt: Bdd, kept: np.ndarray, tau: float) -> Bdd:
    """Each row's dtau = sum_j t_j (mean - z_j) / tau, t = g y, mean = sum y z - w m/tau."""
    mean = badd(bsum(bmul(y, z)), -bmul(w, mt))
    return bdiv_d(bsum(bmul(t, badd(mean[..., None], -z)).where(kept)), tau)


@dataclass
class RowGradients:
    """ds = y (g - c)/tau per kept key, its sum over the row (c w/tau: sum y = 1 - w), and
    each row parameter's gradient per row (in the order of fn.row.params)."""

    ds: Bdd
    total: Bdd
    dparams: list[Bdd]


def row_gradients(fn: AttentionFunction, params: dict[str, float], w: Weights, g: Bdd,
                  shape: tuple[int, ...]) -> RowGradients:
    """The row gradients for the weights w (rows reshaped to shape[:-1]) and the dot
    products g_j = dO_i . v_j (of that shape)."""
    if w.slope is not None:
        return _normalize_gradients(fn, w, g, shape)
    tau = fn.row.temperature(params)
    kept, top = w.kept.reshape(shape), w.top.reshape(shape[:-1])
    y, z = (Bdd(a.h.reshape(shape), a.l.reshape(shape), a.b.reshape(shape)) for a in (w.y, w.z))
    share, q0, mt = (Bdd(a.h.reshape(shape[:-1]), a.l.reshape(shape[:-1]),
                         a.b.reshape(shape[:-1])) for a in (w.share, w.q0, w.mt))
    t = bmul(y, g).where(kept)
    c = bsum(t)
    dif = badd(g, -c[..., None]).where(kept)
    _dominant_difference(dif, g, y, share, top, kept)
    ds = bdiv_d(bmul(y, dif), tau).where(kept)
    finite = kept.any(axis=-1)
    by_role = {TEMPERATURE: lambda: _dtau(t, y, z, share, mt, kept, tau),
               OFFSET: lambda: -bmul(c, q0)}
    dparams = []
    for p in fn.row.params:
        if p.role not in by_role:
            raise ValueError(f"{fn.name}: parameter {p.name} has no gradient rule")
        dparams.append(by_role[p.role]().where(finite))
    return RowGradients(ds, bdiv_d(bmul(c, share), tau).where(finite), dparams)


def _normalize_gradients(fn: AttentionFunction, w: Weights, g: Bdd, shape: tuple[int, ...]
                         ) -> RowGradients:
    """A weight-normalize member's: ds = a'(s) (g - c) / D, d eta = -c / D
    (numerics/certified/normalize.py)."""
    assert w.slope is not None and w.inv is not None
    kept, top = w.kept.reshape(shape), w.top.reshape(shape[:-1])
    y, slope = (Bdd(a.h.reshape(shape), a.l.reshape(shape), a.b.reshape(shape))
                for a in (w.y, w.slope))
    share, inv = (Bdd(a.h.reshape(shape[:-1]), a.l.reshape(shape[:-1]),
                      a.b.reshape(shape[:-1])) for a in (w.share, w.inv))
    c = bsum(bmul(y, g).where(kept))
    dif = badd(g, -c[..., None]).where(kept)
    _dominant_difference(dif, g, y, share, top, kept)
    ds = bmul(bmul(slope, dif), inv[..., None]).where(kept)
    finite = (w.kind == ROW_FINITE).reshape(shape[:-1])
    dparams = []
    for p in fn.row.params:
        if p.role != DENOMINATOR:
            raise ValueError(f"{fn.name}: parameter {p.name} has no gradient rule")
        dparams.append((-bmul(c, inv)).where(finite))
    return RowGradients(ds, bsum(ds).where(finite), dparams)


def _dq(rg: RowGradients, k: np.ndarray, top: np.ndarray) -> Bdd:
    """sum_j ds_ij k_j per query, centred on its top key a: sum_j ds_ij (k_j - k_a) +
    k_a sum_j ds_ij. Where the weight sits on a few keys (ties, a dominant key) the terms
    ds_ij k_j nearly cancel; in this form the keys equal to k_a drop out exactly and the
    row sum is c w / tau, a product."""
    ka = np.take_along_axis(k[:, None, :, :], top[:, :, None, None], axis=2)  # (g, Lq, 1, D)
    dh, dl = dd.two_sum(k[:, None, :, :], -ka)  # k_j - k_a, exactly: (g, Lq, Lk, D)
    diff = Bdd(*(np.swapaxes(a, 2, 3) for a in (dh, dl, np.zeros_like(dh))))  # (g, Lq, D, Lk)
    return badd(bsum(bmul(rg.ds[:, :, None, :], diff)), bmul_d(rg.total[..., None], ka[:, :, 0]))


def _stack(xs: list[Bdd], g: int) -> Bdd:
    """(g,) values side by side: (g, len(xs))."""
    return Bdd(*(np.stack([getattr(x, f) for x in xs], axis=-1) if xs else np.zeros((g, 0))
                 for f in ("h", "l", "b")))


def _usable(a: np.ndarray, nan: bool) -> np.ndarray:
    """Per head (first axis): every element within INPUT_MAX (NaN allowed if nan)."""
    fine = np.abs(a) <= INPUT_MAX
    return (fine | np.isnan(a) if nan else fine).reshape(len(a), -1).all(axis=1)


def gradient_block(truth: AttentionTruth, bounds: dict[str, np.ndarray], heads: slice,
                   fn: AttentionFunction, params: dict[str, float], q: np.ndarray,
                   k: np.ndarray, v: np.ndarray, dout: np.ndarray, scale: float,
                   fmt: FloatFormat, fw: Forward) -> tuple[np.ndarray, np.ndarray]:
    """The certified gradients of g heads (q (g, Lq, D), k, v, dO (g, Lq, Dv)) on their
    certified forward fw, written into truth (and their bounds into bounds) at heads;
    which heads' bounds hold (they stayed in the safe domain), and which are certified."""
    g_, lq, _ = q.shape
    lk = k.shape[1]
    if not row_function_fits(fn, params) or fn.signed:  # mpmath answers (cog's: ds = p g
        # - w c, which the exp family's rule does not form)
        return np.zeros(g_, dtype=bool), np.zeros(g_, dtype=bool)
    kept = fw.w.kept.reshape(g_, lq, lk)
    trusted = (_usable(q, True) & _usable(k, True) & _usable(v, True) & _usable(dout, False)
               & fw.trusted.reshape(g_, lq).all(axis=1))
    q, k = (np.where(np.isnan(a), 0.0, a) for a in (q, k))  # they act through NaN rows only
    with np.errstate(all="ignore"):
        dots = dot(dout[:, :, None, :], v[:, None, :, :]).where(kept)  # NaN from a NaN v
        rg = row_gradients(fn, params, fw.w, dots, (g_, lq, lk))
        y = Bdd(*(a.reshape(g_, lq, lk) for a in (fw.w.y.h, fw.w.y.l, fw.w.y.b)))
        grads = {
            "dq": bmul_d(_dq(rg, k, fw.w.top.reshape(g_, lq)), scale),
            "dk": bmul_d(bsum(bmul_d(_swap(rg.ds)[:, :, None, :],
                                     np.swapaxes(q, 1, 2)[:, None, :, :])), scale),
            "dv": bsum(bmul_d(_swap(y)[:, :, None, :], np.swapaxes(dout, 1, 2)[:, None, :, :])),
            "dp": _stack([bsum(p) for p in rg.dparams], g_),  # summed over the queries
        }
    nan_rows = (fw.w.kind == ROW_NAN).reshape(g_, lq)
    seen = (nan_rows[..., None] & fw.visible.reshape(g_, lq, lk)).any(axis=1)
    for name, nan in (("dq", nan_rows), ("dk", seen), ("dv", seen), ("dp", nan_rows.any(1))):
        grads[name] = _exactly_nan(grads[name], nan)
    ok = trusted.copy()
    for name, x in grads.items():
        hi, lo = (getattr(truth, f"{name}_{part}") for part in ("hi", "lo"))
        shape = (hi.shape[0] * hi.shape[1], *hi.shape[2:])
        hi.reshape(shape)[heads], lo.reshape(shape)[heads] = x.h, x.l
        bounds[name].reshape(shape)[heads] = SLACK * x.b
        good = (params_certified(x, fmt) if name == "dp"
                else certify(x.h, x.l, SLACK * x.b, fmt)) | np.isnan(x.h)
        ok &= good.reshape(g_, -1).all(axis=1)
    _write_zeros(truth, heads, kept | (nan_rows[..., None] & fw.visible.reshape(g_, lq, lk)))
    return trusted, ok


def _exactly_nan(x: Bdd, nan: np.ndarray) -> Bdd:
    """x with NaN wherever mpmath's is (a NaN query's dq, the dk and dv of every key it sees,
    the parameters of its head; and what a NaN g_j = dO_i . v_j made NaN on its way), stored
    as mpmath's NaN is (lo 0) and exact by structure (bound 0)."""
    h = np.where(nan[(...,) + (None,) * (x.h.ndim - nan.ndim)], np.nan, x.h)
    bad = np.isnan(h)
    return Bdd(h, np.where(bad, 0.0, x.l), np.where(bad, 0.0, x.b))


def _write_zeros(truth: AttentionTruth, heads: slice, reached: np.ndarray) -> None:
    """What nothing reaches is exactly 0: dq of a query that reaches no key, dk and dv of a
    key no query reaches (kept, or seen by a NaN query; the flags have their gradient's
    shape)."""
    for name, touched in (("dzero_q", reached.any(axis=2)), ("dzero_k", reached.any(axis=1)),
                          ("dzero_v", reached.any(axis=1))):
        flags = getattr(truth, name)
        flags.reshape(-1, *flags.shape[2:])[heads] = ~touched[..., None]


def params_certified(p: Bdd, fmt: FloatFormat) -> np.ndarray:
    """Per head: a parameter's gradient known to CERTIFY_ULP units of the working precision
    relative to its size (the scale the checker judges it on), as for rows
    (certified_grad.params_certified)."""
    uw, tiny, _ = work_format(fmt)
    err = SLACK * p.b
    return err <= CERTIFY_ULP * uw * np.maximum(np.abs(p.h) - err, tiny)
