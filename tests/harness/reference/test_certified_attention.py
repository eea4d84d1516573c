"""The certified attention reference against the mpmath oracle (docs/numerics.md section 6.5).

On drawn inputs (every attention generator, every dtype, both attention functions, with
ties, exactly zero and all-negative scores, huge logits, tiny and huge tau, non-finite
values mixed in), the oracle at 256 bits must lie within the claimed bound of every value
the certified phase computed where it says its bounds hold, and every certified value must
agree with it to the certify tolerance (2^-12 ulp of the format; the parameters' gradients
2^-12 units of the working precision, relatively), in the same binade. The forward's
float64 side products (weights, |z|, zbar, kind, the special-value flags) must be the
oracle's. ELASTICBENCH_ATTENTION_PROPERTY_ELEMENTS sets how many output values each
function and mode sees on average.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elasticbench.harness.functions import ATTENTION_FUNCTIONS, get_attention_function
from elasticbench.harness.kinds.attention.qkv_inputs import ATTENTION_GENERATORS, generate_qkv
from elasticbench.harness.numerics.budgets import attention_budgets as attention_budget
from elasticbench.harness.numerics.certified import attention_forward as certified_attention
from elasticbench.harness.numerics.certified.bounds import CERTIFY_ULP
from elasticbench.harness.numerics.dtypes import DTYPE_NAMES, get_format, work_format
from elasticbench.harness.numerics.truth import attention_truth as at
from elasticbench.harness.numerics.truth.cache import TruthStats
from elasticbench.harness.numerics.ulp import ulp_of

ELEMENTS = int(float(os.environ.get("ELASTICBENCH_ATTENTION_PROPERTY_ELEMENTS", "2000")))
ORACLE_BITS = 256
SLACK_BITS = ORACLE_BITS - 24  # the oracle's own error, relative to its terms' magnitudes
MEAN_VALUES = 20  # output values of a drawn input, roughly (sizes below)
PROPERTY = settings(deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


# the functions the certified phase evaluates (the exp family's; it declines the rest, whose
# values mpmath alone gives: tests/library/test_attention_family.py)
CERTIFIED = sorted(name for name, f in ATTENTION_FUNCTIONS.items()
                   if certified_attention.row_function_fits(f, f.defaults()))


def _examples() -> int:
    return max(8, math.ceil(ELEMENTS / MEAN_VALUES))


@st.composite
def drawn_case(draw, grads: bool):
    fn = get_attention_function(draw(st.sampled_from(CERTIFIED)))
    dtype = draw(st.sampled_from(DTYPE_NAMES))
    fmt = get_format(dtype)
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 6)),
             draw(st.integers(1, 7)), draw(st.integers(1, 6)))
    seed = draw(st.integers(0, 2**31))
    q, k, v = (a.astype(np.float64) for a in generate_qkv(
        draw(st.sampled_from(sorted(ATTENTION_GENERATORS))), dtype, shape, seed))
    rng = np.random.default_rng(seed)
    twist = draw(st.sampled_from(["none", "ties", "zero", "cancel", "huge", "negative",
                                  "specials"]))
    q, k, v = _twist(twist, q, k, v, rng, fmt)
    dv = draw(st.integers(1, 4))
    v = fmt.cast(np.concatenate([v, rng.standard_normal((*v.shape[:3], dv))], axis=3)
                 ).astype(np.float64)
    params = {}
    for p in fn.params:
        if p.name in ("causal", "gate"):  # switches (the truth never reads gate)
            params[p.name] = float(draw(st.booleans()))
            continue
        lo, hi = (2.0**-10, 2.0**10) if p.name == "tau" else p.span
        value = float(np.exp(draw(st.floats(math.log(lo), math.log(hi)))))
        params[p.name] = draw(st.sampled_from([value, *p.grid]))
    params = fn.validate_params(params)
    scale = draw(st.sampled_from([1.0 / math.sqrt(shape[4]), 0.5, 1.0]))
    dout = fmt.cast(rng.standard_normal((*q.shape[:3], v.shape[3]))).astype(np.float64) \
        if grads else None
    return fn, fmt, params, q, k, v, scale, dout


def _twist(kind: str, q, k, v, rng, fmt):
    """Adversarial changes on top of a generator's draw."""
    if kind == "ties":  # equal keys and queries: equal scores, tied maxima
        k[:, :, 1::2] = k[:, :, :1]
        q[:, :, 1::2] = q[:, :, :1]
    elif kind == "zero":  # exactly zero scores: kept by Elastic-Softmax (s >= 0)
        q[:, :, ::2] = 0.0
    elif kind == "cancel":  # scores that cancel exactly: q = (a, a, ...), k = (b, -b, ...)
        q[..., 1::2] = q[..., ::2][..., : q[..., 1::2].shape[-1]]
        k[..., 1::2] = -k[..., ::2][..., : k[..., 1::2].shape[-1]]
    elif kind == "huge":  # logits in the thousands where the format allows
        f = min(64.0, math.sqrt(fmt.max) / 16)
        q, k = q * f, k * f
    elif kind == "negative":  # every score negative: nothing kept
        q, k = -np.abs(q) - 0.125, np.abs(k) + 0.125
    elif kind == "specials":
        for a in (q, k, v):
            flat = a.reshape(-1)
            flat[rng.integers(0, flat.size)] = rng.choice([np.inf, -np.inf, np.nan, 0.0])
    return tuple(fmt.cast(a).astype(np.float64) for a in (q, k, v))


def _magnitudes(oracle: at.AttentionTruth, params, fn, q, k, v, scale, dout):
    """Per value, the size of the terms the oracle sums for it (in float64): its own error
    is below 2^-SLACK_BITS of that."""
    w = np.abs(np.nan_to_num(oracle.w))  # (cog's are signed: the sizes are |w|'s)
    av, out = np.abs(np.nan_to_num(v, posinf=0, neginf=0)), {}
    out["out"] = w @ av
    if dout is None:
        return out
    tau = fn.row.temperature(params)
    ado = np.abs(np.nan_to_num(dout, posinf=0, neginf=0))
    p = ado @ np.swapaxes(av, -1, -2)  # |dO_i| . |v_j|
    c = (w * p).sum(-1, keepdims=True)
    ds = w * (p + c) / tau
    if fn.row.weights is not None:  # a weight-normalize member: ds = a'(s) (g - c) / D
        qs, ks = (np.nan_to_num(a, nan=0, posinf=0, neginf=0) for a in (q, k))
        s = scale * qs @ np.swapaxes(ks, -1, -2)
        a, slope, _ = attention_budget._shape(fn.row.name, s)
        lq, lk = s.shape[-2:]
        seen = np.tril(np.ones((lq, lk), bool)) if params.get("causal") else np.ones((lq, lk))
        den = np.where(seen, a, 0).sum(-1, keepdims=True) + fn.row.weight_offset(params)
        ds = np.where(seen, slope, 0) * (p + c) / np.where(den > 0, den, np.inf)
        c = c / np.where(den > 0, den, np.inf)
    mt = np.nan_to_num(oracle.zbar)[..., None] + np.nan_to_num(oracle.zabs) + 1
    out["dq"] = scale * ds @ np.abs(np.nan_to_num(k, posinf=0, neginf=0))
    out["dk"] = scale * np.swapaxes(ds, -1, -2) @ np.abs(np.nan_to_num(q, posinf=0, neginf=0))
    out["dv"] = np.swapaxes(w, -1, -2) @ ado
    big = (ds * (mt + np.abs(np.nan_to_num(oracle.zabs)).max() + 1)).sum((-1, -2))
    out["dp"] = np.repeat((big + c[..., 0].sum(-1))[..., None], len(fn.row_params), axis=-1)
    return out


def _check(name, fast, oracle, bound, trusted, ok, size, fmt, relative=False):
    """err <= bound where trusted; err within the certify tolerance where ok (ok, trusted:
    masks over the leading axes of the values)."""
    fh, fl = getattr(fast, f"{name}_hi"), getattr(fast, f"{name}_lo")
    oh, ol = getattr(oracle, f"{name}_hi"), getattr(oracle, f"{name}_lo")
    ext = (...,) + (None,) * (fh.ndim - trusted.ndim)
    trusted, ok = np.broadcast_to(trusted[ext], fh.shape), np.broadcast_to(ok[ext], fh.shape)
    finite = np.isfinite(oh)
    assert ((np.isnan(fh) == np.isnan(oh)) & (np.isnan(fl) == np.isnan(ol)) | ~ok).all(), name
    assert ((fh == oh) | finite | np.isnan(oh) | ~ok).all(), name  # the same infinities
    slack = size * 2.0**-SLACK_BITS + np.abs(np.nan_to_num(oh)) * 2.0**-(ORACLE_BITS - 4)
    with np.errstate(invalid="ignore"):
        err = np.abs((fh - oh) + (fl - ol))
    sel = trusted & finite
    assert (err[sel] <= bound[sel] + slack[sel]).all(), (name, np.argwhere(
        sel & (err > bound + slack))[:3], err[sel].max())
    sel = ok & finite
    if relative:
        uw, tiny, _ = work_format(fmt)
        tol = CERTIFY_ULP * uw * np.maximum(np.abs(oh), tiny)
    else:
        ulp = ulp_of(np.nan_to_num(oh), np.nan_to_num(ol), fmt)
        tol = CERTIFY_ULP * ulp
        assert (ulp_of(fh, fl, fmt) == ulp)[sel & (np.abs(oh) > 2 * slack)].all(), name
    assert (err[sel] <= tol[sel] + slack[sel]).all(), (name, err[sel].max())


def _forward_side_values(fast: at.AttentionTruth, oracle: at.AttentionTruth,
                         bounds: dict[str, np.ndarray], rows: np.ndarray) -> None:
    """kind, zero and NaN flags exactly; the weights, |z| and zbar (the budget's float64
    inputs, each rounded once on both sides) within their bounds of the oracle's."""
    assert (fast.kind[rows] == oracle.kind[rows]).all()
    assert (fast.out_zero[rows] == oracle.out_zero[rows]).all()
    assert (fast.out_nan_ok[rows] == oracle.out_nan_ok[rows]).all()
    for name in ("w", "zabs", "zbar"):
        a, b = getattr(fast, name)[rows], getattr(oracle, name)[rows]
        assert (np.isnan(a) == np.isnan(b)).all(), name
        a, b = np.nan_to_num(a), np.nan_to_num(b)
        allowed = bounds[name][rows] + 2.0**-52 * (np.abs(a) + np.abs(b)) + 2.0**-1070
        assert (np.abs(a - b) <= allowed).all(), (name, np.abs(a - b).max())


def _run(case):
    fn, fmt, params, q, k, v, scale, dout = case
    with np.errstate(all="ignore"):
        cert = at.certified_phase(fn, params, q, k, v, scale, dout, fmt)
    oracle = at.oracle_evaluate(fn, params, q, k, v, scale, dout, ORACLE_BITS)
    size = _magnitudes(oracle, params, fn, q, k, v, scale, dout)
    fast = cert.truth
    _check("out", fast, oracle, cert.bounds["out"], cert.trusted_rows, cert.ok_rows,
           size["out"], fmt)
    _forward_side_values(fast, oracle, cert.bounds, cert.ok_rows)
    if dout is None:
        return
    heads = cert.ok_heads
    for name in ("dq", "dk", "dv"):
        _check(name, fast, oracle, cert.bounds[name], cert.trusted_heads, heads, size[name],
               fmt)
        flags = f"dzero_{name[1]}"
        assert (getattr(fast, flags)[heads] == getattr(oracle, flags)[heads]).all()
    _check("dp", fast, oracle, cert.bounds["dp"], cert.trusted_heads, heads, size["dp"], fmt,
           relative=True)


@settings(PROPERTY, max_examples=_examples())
@given(drawn_case(grads=False))
def test_certified_attention_outputs_hold_against_mpmath(case):
    _run(case)


@settings(PROPERTY, max_examples=_examples())
@given(drawn_case(grads=True))
def test_certified_attention_gradients_hold_against_mpmath(case):
    _run(case)


@pytest.mark.parametrize("grads", [False, True])
def test_the_reference_is_the_oracle_where_it_is_not_certified(grads):
    """evaluate: certified values where certified, the oracle's (bit for bit) elsewhere, and
    TruthStats counting what mpmath computed."""
    fn = get_attention_function("elastic_attention")
    params = {"tau": 0.01, "beta": 1.0, "causal": 1.0}
    q, k, v = (a.astype(np.float64) for a in generate_qkv("nan_v", "fp64", (2, 2, 5, 6, 3), 1))
    q[0, 1, 2] *= 2.0**600  # out of the certified phase's range: mpmath for this query
    dout = np.random.default_rng(0).standard_normal((2, 2, 5, 3)) if grads else None
    stats = TruthStats()
    truth = at.evaluate(fn, params, q, k, v, 0.5, dout, fmt=get_format("fp64"), stats=stats)
    oracle = at.oracle_evaluate(fn, params, q, k, v, 0.5, dout)
    with np.errstate(all="ignore"):
        cert = at.certified_phase(fn, params, q, k, v, 0.5, dout, get_format("fp64"))
    heads = ~cert.ok_heads if grads else np.zeros((2, 2), dtype=bool)
    rows = ~cert.ok_rows & ~heads[..., None]
    assert (rows.any() or heads.any()) and not (rows.all() or heads.all())
    for name in at.AttentionTruth.FIELDS:
        a, b = getattr(truth, name), getattr(oracle, name)
        if a.shape[:2] == heads.shape:
            np.testing.assert_array_equal(a[heads], b[heads], err_msg=name)
        if name in at.FORWARD_FIELDS:
            np.testing.assert_array_equal(a[rows], b[rows], err_msg=name)
    per_row, per_head = 3, 5 * 3 + (5 * 3 + 6 * 3 + 6 * 3 if grads else 0)
    assert stats.elements == per_head * 4
    assert stats.fallback_elements == per_row * rows.sum() + per_head * heads.sum()
    assert 0 < stats.fallback_share < 1
