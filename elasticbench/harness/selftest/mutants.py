"""Deliberately wrong kernels, one classic softmax bug each.

Every mutant is the correct computation with one change, so catching it shows the suite
sees that bug class, and nothing else. They are KernelSpecs that never enter the global
registry (a user's `verify` never sees them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from elasticbench.harness.registry import KernelSpec


@dataclass(frozen=True)
class Mutant:
    spec: KernelSpec
    bug: str  # the bug class, in words
    # a breach of the default contract only: the `own` contract (16-bit arithmetic
    # throughout, numerics/contract.py) allows it, so the self-test does not ask it to fail
    # there
    own_allows: bool = False


def _work(x: np.ndarray) -> np.ndarray:
    """x in the working precision, rows contiguous (NumPy sums pairwise only along them)."""
    return np.ascontiguousarray(x, dtype=np.float64 if x.dtype == np.float64 else np.float32)


def _elastic(
    x: np.ndarray,
    tau: float,
    beta: float,
    *,
    shift: bool = True,
    rescale: bool = True,
    strict: bool = False,
    propagate_nan: bool = True,
    safe_empty: bool = True,
    acc_dtype: type | None = None,
    tau_op: Callable[[np.ndarray, float], np.ndarray] = np.divide,
    axis: int = -1,
) -> np.ndarray:
    """Correct Elastic-Softmax (working precision, policy included) unless a flag says not."""
    xw = _work(x)
    with np.errstate(invalid="ignore"):
        keep = xw > 0 if strict else xw >= 0
    s = np.where(keep, xw, -np.inf)
    m = s.max(axis=axis, keepdims=True)
    inf_row = m == np.inf
    m0 = np.where(np.isfinite(m), m, 0).astype(xw.dtype) if shift else np.zeros_like(m)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.where(inf_row, s == np.inf, np.exp(tau_op(s - m0, xw.dtype.type(tau))))
        e = e.astype(xw.dtype)
        if acc_dtype is None:
            den = e.sum(axis=axis, keepdims=True)
        else:  # a running sum kept in the low format, as a naive kernel would
            den = np.zeros_like(m, dtype=acc_dtype)
            for j in range(0, e.shape[axis], 128):
                den = (den + e[:, j:j + 128].sum(axis=-1, keepdims=True)).astype(acc_dtype)
            den = den.astype(xw.dtype)
        offset = beta * np.exp(-m0 / tau) if rescale else np.full_like(m0, beta)
        den = den + np.where(inf_row, 0, offset)
        y = np.divide(e, den, out=np.zeros_like(e), where=den > 0) if safe_empty else e / den
    if propagate_nan:
        y[np.broadcast_to(np.isnan(xw).any(axis=axis, keepdims=True), y.shape)] = np.nan
    return y.astype(x.dtype)


def _softmax1(x: np.ndarray, *, rescale_one: bool = True) -> np.ndarray:
    xw = _work(x)
    m = np.maximum(xw.max(axis=-1, keepdims=True), 0)
    inf_row = m == np.inf
    m0 = np.where(np.isfinite(m), m, 0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(inf_row, xw == np.inf, np.exp(xw - m0)).astype(xw.dtype)
        one = np.exp(-m0) if rescale_one else np.ones_like(m0)
        den = e.sum(axis=-1, keepdims=True) + np.where(inf_row, 0, one)
    y = e / den
    y[np.isnan(xw).any(axis=-1)] = np.nan
    return y.astype(x.dtype)


def _in_place(x, *, tau, beta):
    y = _elastic(x, tau, beta)
    x[...] = y  # the input used as the output buffer; a copy is returned
    return y.copy()


def _low_acc(x, *, tau, beta):
    """fp16/bf16 inputs summed in their own format; other formats are left correct."""
    acc = {np.dtype(np.float16): np.float16, np.dtype(ml_dtypes.bfloat16): ml_dtypes.bfloat16}
    return _elastic(x, tau, beta, acc_dtype=acc.get(x.dtype))


def _rel_error(x, *, tau, beta):
    y = _elastic(x, tau, beta).astype(np.float64)
    return (y * (1 + 1e-4)).astype(x.dtype)


# ---- wrong on one path only: a width, a row block, a parameter band, an exp band, a layout


def _multi_block(x, *, tau, beta):
    """Rows wider than 65536 take a multi-block path whose block sums are added without
    rescaling each to the row's maximum (each block shifted by its own)."""
    if x.shape[1] <= 65536:
        return _elastic(x, tau, beta)
    xw = _work(x)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(xw >= 0, xw, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        m0 = np.where(np.isfinite(m), m, 0)
        den = np.zeros_like(m0)
        for j in range(0, xw.shape[1], 65536):
            b = s[:, j:j + 65536]
            bm = b.max(axis=-1, keepdims=True)
            den += np.exp((b - np.where(np.isfinite(bm), bm, 0)) / tau).sum(-1, keepdims=True)
        y = np.exp((s - m0) / tau) / (den + beta * np.exp(-m0 / tau))
    good = np.isfinite(m).ravel() & ~np.isnan(xw).any(axis=-1)
    out = _elastic(x, tau, beta).astype(xw.dtype)
    out[good] = y[good]
    return out.astype(x.dtype)


def _row_blocks(x, *, tau, beta):
    """Rows past the first launch block of 512 rescale beta with the row maxima of the
    first block (a stale per-row buffer)."""
    y = _elastic(x, tau, beta)
    if x.shape[0] <= 512:
        return y
    xw = _work(x)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(xw >= 0, xw, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        m0 = np.where(np.isfinite(m), m, 0)
        stale = m0[np.arange(x.shape[0]) % 512]
        e = np.exp((s - m0) / tau)
        late = e / (e.sum(-1, keepdims=True) + beta * np.exp(-stale / tau))
    rows = np.arange(x.shape[0]) >= 512
    rows &= np.isfinite(m).ravel() & ~np.isnan(xw).any(axis=-1)
    y[rows] = late[rows].astype(x.dtype)
    return y


def _tau_table(x, *, tau, beta):
    """For 2 < tau < 8 the scale 1/tau comes from a table of 3 significant digits."""
    if not 2 < tau < 8:
        return _elastic(x, tau, beta)
    inv = float(f"{1 / tau:.3g}")
    return _elastic(x, tau, beta, tau_op=lambda d, _t: d * d.dtype.type(inv))


def _exp_band(x, *, tau, beta):
    """An exp whose polynomial is 1e-3 off on the band -12 < z < -8."""
    def scaled(d, t):
        z = d / t
        with np.errstate(invalid="ignore"):
            band = (z > -12) & (z < -8)
        return np.where(band, z + np.log1p(z.dtype.type(1e-3)), z)

    return _elastic(x, tau, beta, tau_op=scaled)


def _packed_rows(x, *, tau, beta):
    """Reads its input's memory as packed rows (row stride n): right on fresh arrays only."""
    packed = np.lib.stride_tricks.as_strided(x, x.shape, (x.shape[1] * x.itemsize, x.itemsize))
    return _elastic(packed.copy(), tau, beta)


def _spec(name: str, function: str, fn: Callable) -> KernelSpec:
    return KernelSpec(name, function, "numpy", fn, "fwd", "selftest")


FORWARD_MUTANTS: tuple[Mutant, ...] = (
    Mutant(_spec("no_max_shift", "elastic",
                 lambda x, *, tau, beta: _elastic(x, tau, beta, shift=False)),
           "no max shift: exp overflows on large logits"),
    Mutant(_spec("beta_not_rescaled", "elastic",
                 lambda x, *, tau, beta: _elastic(x, tau, beta, rescale=False)),
           "beta added after the shift without the exp(-m/tau) rescaling"),
    Mutant(_spec("one_not_rescaled", "softmax1", lambda x: _softmax1(x, rescale_one=False)),
           'softmax1: the "+1" added after the shift without rescaling'),
    Mutant(_spec("strict_mask", "elastic",
                 lambda x, *, tau, beta: _elastic(x, tau, beta, strict=True)),
           "strict > 0 mask: exact zeros masked"),
    Mutant(_spec("nan_masked", "elastic",
                 lambda x, *, tau, beta: _elastic(x, tau, beta, propagate_nan=False)),
           "NaN silently masked by where(x >= 0, x, -inf)"),
    Mutant(_spec("zero_over_zero", "elastic",
                 lambda x, *, tau, beta: _elastic(x, tau, beta, safe_empty=False)),
           "0/0 on fully masked rows with beta = 0 gives NaN"),
    Mutant(_spec("low_precision_sum", "elastic", _low_acc),
           "row sums accumulated in fp16/bf16", own_allows=True),
    Mutant(_spec("tau_multiplied", "elastic",
                 lambda x, *, tau, beta: _elastic(x, tau, beta, tau_op=np.multiply)),
           "tau applied wrongly (multiplied instead of divided)"),
    Mutant(_spec("beta_ignored", "elastic",
                 lambda x, *, tau, beta: _elastic(x, tau, 0.0)),
           "beta ignored"),
    Mutant(_spec("relative_error_1e-4", "elastic", _rel_error),
           "a small relative error (1e-4)"),
    Mutant(_spec("wrong_axis", "elastic",
                 lambda x, *, tau, beta: _elastic(x, tau, beta, axis=0)),
           "normalized along the wrong axis"),
    Mutant(_spec("input_modified", "elastic", _in_place),
           "input modified in place"),
)

PATH_MUTANTS: tuple[Mutant, ...] = (
    Mutant(_spec("multi_block_unscaled", "elastic", _multi_block),
           "past 65536 columns, block sums added without rescaling to the row maximum"),
    Mutant(_spec("row_block_stale_max", "elastic", _row_blocks),
           "past row 512, beta rescaled with the first row block's maxima"),
    Mutant(_spec("tau_table", "elastic", _tau_table),
           "for 2 < tau < 8, 1/tau from a table of 3 significant digits"),
    Mutant(_spec("exp_band", "elastic", _exp_band),
           "exp 1e-3 off on the band -12 < z < -8"),
    Mutant(_spec("packed_rows", "elastic", _packed_rows),
           "reads its input as packed rows (padded and strided inputs misread)"),
)


def _bwd_recomputed_without_mask(x, y, g, *, tau, beta):
    """A recomputing backward (y rebuilt from x to save memory) that forgot the mask."""
    from elasticbench.harness.builtin.numpy_kernels import numpy_elastic_bwd

    _, dtau, dbeta = numpy_elastic_bwd(x, y, g, tau=tau, beta=beta)
    xf, gf = x.astype(np.float64), g.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.where(np.isfinite(xf), xf, -np.inf).max(axis=-1, keepdims=True)
        m0 = np.where(np.isfinite(m), m, 0)
        e = np.where(np.isfinite(xf), np.exp((xf - m0) / tau), 0)
        yr = e / (e.sum(axis=-1, keepdims=True) + beta * np.exp(-m0 / tau))
        dx = yr * (gf - (gf * yr).sum(axis=-1, keepdims=True)) / tau
    return dx.astype(x.dtype), dtau, dbeta


def _bwd_offset_not_rescaled(x, y, g, *, tau, beta):
    """dbeta = -c / D' with the shifted denominator: the exp(-m/tau) factor forgotten."""
    from elasticbench.harness.builtin.numpy_kernels import numpy_elastic_bwd

    dx, dtau, _ = numpy_elastic_bwd(x, y, g, tau=tau, beta=beta)
    yf, gf = y.astype(np.float64), g.astype(np.float64)
    c = (gf * yf).sum(axis=-1)
    return dx, dtau, float(-(c * yf.max(axis=-1)).sum())


BACKWARD_MUTANTS: tuple[Mutant, ...] = (
    Mutant(KernelSpec("bwd_forgets_mask", "elastic", "numpy", _bwd_recomputed_without_mask,
                      "bwd", "selftest"),
           "a backward that forgets the mask (masked logits get a gradient)"),
    Mutant(KernelSpec("bwd_offset_not_rescaled", "elastic", "numpy", _bwd_offset_not_rescaled,
                      "bwd", "selftest"),
           "dbeta from the shifted denominator without exp(-m/tau)"),
)
MUTANTS = FORWARD_MUTANTS + PATH_MUTANTS + BACKWARD_MUTANTS
