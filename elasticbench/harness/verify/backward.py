"""Verifying backward kernels: upstream gradients, the call, and scoring against exact truth.

A backward kernel gets the input x, the saved output y (the exact output rounded to the
format, so the backward is judged apart from any forward kernel) and a seeded upstream
gradient g in the same format, and returns dx (and the gradient of each of the function's
parameters, summed over the whole tensor). dx is scored in ulps of its format against a
budget derived from the first-order error of the computation (docs/gradients.md); each
parameter's gradient by relative error against the bound of its role in the exp-normalize
form (temperature or offset, as the Function declares). Rows not checked (sampled large
inputs) get g = 0 and y = 0, so they contribute exactly nothing to the parameter gradients,
but for a NaN row: its y is NaN, as its forward's is, and it makes them NaN.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from elasticbench.harness.backends import get_backend
from elasticbench.harness.execute import NativeInput, guarded_call
from elasticbench.harness.functions import Function, get_function
from elasticbench.harness.functions.definition import OFFSET, ROW_FINITE, TEMPERATURE
from elasticbench.harness.inputs.generators import stream_seed
from elasticbench.harness.inputs.layouts import PACKED
from elasticbench.harness.numerics.contract import OWN, Judging
from elasticbench.harness.numerics.dtypes import FloatFormat, work_format
from elasticbench.harness.numerics.truth.row_truth import GradTruth
from elasticbench.harness.numerics.ulp import ulp_of
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.verify.check import (
    CheckResult,
    checked,
    describe_error,
    json_float,
    position,
    score,
    worst_within,
    zero_place,
)


@dataclass(frozen=True)
class GradBudget:
    """Allowance for dx: a + b * E_k / ulp(dx_k) ulps, E_k the first-order error bound of
    y_k (g_k - c)/tau given y rounded to the format and sums in the working precision;
    for dtau, dbeta: b * (their first-order bound) + a summation term (docs/gradients.md)."""

    a: float = 1.0
    b: float = 2.0
    own: bool = False  # the `own` contract: E with the format's unit roundoff, not fp32's
    scale: float = 1.0  # the run's budget scale: every allowance times it

    def describe(self) -> str:
        return f"{self.a:g} + {self.b:g}·E/ulp(dx) ulp; params {self.b:g}·E relative"

    def to_dict(self) -> dict[str, float]:
        return {"a": self.a, "b": self.b}


def grad_budget(judging: Judging) -> GradBudget:
    """The backward budget of a contract and a run's scale (E is a bound whose roundoff
    follows the contract; the scale multiplies the whole allowance)."""
    return GradBudget(GRAD_BUDGET.a, GRAD_BUDGET.b, judging.accuracy == OWN, judging.scale)


def working(fmt: FloatFormat, own: bool) -> tuple[float, float, float]:
    """(unit roundoff, smallest normal, smallest subnormal) that a kernel's steps round to:
    the format's own under the `own` contract, else work_format's."""
    if own:
        return fmt.unit_roundoff, 2.0 ** fmt.emin, fmt.min_ulp
    return work_format(fmt)



GRAD_BUDGET = GradBudget()


def upstream(case_seed: int, generator: str, fmt: FloatFormat, shape: tuple[int, int],
             rows: np.ndarray) -> np.ndarray:
    """The seeded upstream gradient of a case: N(0, 1) in the format, 0 on unchecked rows."""
    seed = [*stream_seed(case_seed, generator, fmt.name, shape), zlib.crc32(b"upstream")]
    g = np.random.default_rng(seed).standard_normal(shape)
    mask = np.zeros(shape[0], dtype=bool)
    mask[rows] = True
    return fmt.cast(np.where(mask[:, None], g, 0.0))


def saved_output(truth: GradTruth, fmt: FloatFormat, x: np.ndarray) -> np.ndarray:
    """The exact forward output rounded to the format; on rows the truth does not cover, 0,
    or NaN where the row holds a NaN (what its forward gives, by policy: a kernel may find
    the NaN row through y, and a y of 0 there would hide it)."""
    y = np.where(nan_rows(truth, x)[:, None], np.nan, np.zeros(x.shape))
    y[truth.rows] = truth.hi + truth.lo
    return fmt.cast(y)


@dataclass
class BackwardOutcome:
    dx: np.ndarray | None
    dparams: dict[str, float]
    error: str | None
    modified_input: bool
    seconds: float
    raised: dict[str, Any] | None = None  # the exception, when it raised (exception_record)
    warnings: list[dict[str, Any]] = field(default_factory=list)  # what it warned
    modified_args: list[str] = field(default_factory=list)  # of x, y, g: those it wrote to


def call_backward(spec: KernelSpec, x: np.ndarray, y: np.ndarray, g: np.ndarray,
                  params: dict[str, float], layout: str = PACKED) -> BackwardOutcome:
    """Run a bwd kernel on fresh native copies of x, y, g (each in the given layout); bring
    dx and the scalars back."""
    backend = get_backend(spec.backend)
    names = get_function(spec.function).param_names
    args = [NativeInput.make(backend, a, layout) for a in (x, y, g)]
    call = guarded_call(backend, spec.fn, *(a.view for a in args), **params)
    seconds, warned = call.seconds, call.warnings
    if call.raised is not None:
        return BackwardOutcome(None, {}, call.error, False, seconds, call.raised, warned)
    out = call.value
    wrote = [n for n, a in zip(("x", "y", "g"), args, strict=True) if any(a.changes())]
    modified = bool(wrote)
    want = 1 + len(names)
    parts = out if names else (out,)
    if not isinstance(parts, tuple | list) or len(parts) != want:
        what = f"(dx, {', '.join('d' + n for n in names)})" if names else "dx alone"
        return BackwardOutcome(None, {}, f"must return {what}", modified, seconds,
                               warnings=warned, modified_args=wrote)
    try:
        dx = np.array(backend.to_numpy(parts[0]), copy=True)
        dparams = {n: float(v) for n, v in zip(names, parts[1:], strict=True)}
    except (TypeError, ValueError, RuntimeError) as e:
        return BackwardOutcome(None, {}, f"returned the wrong type: {e}".splitlines()[0],
                               modified, seconds, warnings=warned, modified_args=wrote)
    return BackwardOutcome(dx, dparams, None, modified, seconds, warnings=warned,
                           modified_args=wrote)


@dataclass
class ParamCheck:
    got: float
    expected: float
    rel_err: float
    allowed_rel: float
    passed: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"got": json_float(self.got), "expected": json_float(self.expected),
                "rel_err": json_float(self.rel_err),
                "allowed_rel": json_float(self.allowed_rel),
                "passed": bool(self.passed), "reason": self.reason}


class _Rows:
    """Per-row quantities of the truth that every budget below is built from (float64), for
    a function in the exp-normalize form (its mask, shift floor, temperature and offset)."""

    def __init__(self, x: np.ndarray, g: np.ndarray, truth: GradTruth, fmt: FloatFormat,
                 function: Function, params: dict[str, float], own: bool = False):
        tau, beta = function.temperature(params), function.offset(params)
        self.uw, self.tiny, self.sub = working(fmt, own)
        self.finite = truth.kind == ROW_FINITE
        f = self.finite[:, None]
        self.y = np.where(f, truth.hi, 0.0)
        self.g = np.where(f, g[truth.rows].astype(np.float64), 0.0)
        self.tau = tau
        # Rounding y to the format costs half an ulp (subnormal spacing included); a whole
        # ulp is used, as half the fp64 subnormal spacing is not a float64, and the exact y
        # reaches the format through its float64 hi part (a second rounding).
        self.ey = np.where(f & ~truth.dzero, ulp_of(truth.hi, truth.lo, fmt), 0.0)
        n = x.shape[1]
        self.gamma = (math.log2(max(n, 1)) + 2) * self.uw
        ag = np.abs(self.g)
        self.c = (self.g * self.y).sum(axis=1)
        self.dc = (ag * self.ey).sum(axis=1) + self.gamma * (ag * self.y).sum(axis=1)
        xr = x[truth.rows].astype(np.float64)
        with np.errstate(invalid="ignore"):
            kept = function.kept(xr)
        m = np.maximum(np.where(kept & f, xr, -np.inf).max(axis=1), function.shift_floor)
        with np.errstate(over="ignore", invalid="ignore"):
            self.mt = np.where(self.finite, m, 0.0) / tau
            self.ymax = self.y.max(axis=1)
            self.q = np.exp(-self.mt) * self.ymax
            w = beta * self.q
            self.wmt = np.where(w > 0, w * self.mt, 0.0)
        # Beyond zcap exp(-|z|) is below the format's subnormals: y rounds to 0 and any
        # y-rounding error there is multiplied by at most zcap, not by |z|.
        zcap = np.log(2.0) * (fmt.p - fmt.emin) + 1.0
        self.z = -np.where(f & (self.y > 0), truth.zabs, 0.0)
        self.zc = np.minimum(np.where(f, truth.zabs, 0.0), zcap)

    def dx_allowed(self, truth: GradTruth, ulp: np.ndarray, budget: GradBudget) -> np.ndarray:
        """Allowed ulps per dx, given the ulps of the exact dx (dx_ulp)."""
        ag, c = np.abs(self.g), self.c[:, None]
        dx = np.abs(np.nan_to_num(truth.dx_hi))
        e = ((self.ey * np.abs(self.g - c) + self.y * (self.dc[:, None] + self.uw * (ag + np.abs(c))))
             / self.tau + 3 * self.uw * dx + self.sub / self.tau)
        with np.errstate(over="ignore"):  # a bound beyond float64 allows anything there
            return budget.scale * (budget.a + budget.b * e / ulp)

    def temperature_bound(self) -> np.ndarray:
        """First-order bound of each row's contribution to the temperature's gradient."""
        ag, ac = np.abs(self.g), np.abs(self.c)
        z, az = self.z, np.abs(self.z)
        a_mean = (self.y * z).sum(axis=1) - self.wmt
        spread = np.abs(a_mean)[:, None] + az
        spread_c = np.abs(a_mean)[:, None] + self.zc
        eymax = np.where(self.ymax > 0, self.ey.max(axis=1) / np.where(self.ymax > 0, self.ymax, 1), 0)
        size = ((ag * self.y * spread).sum(axis=1) + ac * ((self.y * az).sum(axis=1) + self.wmt))
        from_y = (ag * self.ey * spread_c).sum(axis=1) + ac * ((self.ey * self.zc).sum(axis=1)
                                                                + self.wmt * eymax)
        with np.errstate(invalid="ignore"):
            from_w = np.where(self.wmt > 0, ac * self.wmt * (np.abs(self.mt) + 3) * self.uw, 0)
        return (from_y + from_w + (self.gamma + 4 * self.uw) * size) / self.tau

    def offset_bound(self) -> np.ndarray:
        """First-order bound of each row's contribution to the offset's gradient."""
        eymax = np.where(self.ymax > 0, self.ey.max(axis=1) / np.where(self.ymax > 0, self.ymax, 1), 0)
        with np.errstate(invalid="ignore"):
            return np.where(self.q > 0, np.abs(self.q) * (
                self.dc + np.abs(self.c) * (eymax + (np.abs(self.mt) + 3) * self.uw)), 0.0)


# The bound of a parameter's gradient, by the role the Function gives the parameter.
BOUNDS: dict[str, Callable[[_Rows], np.ndarray]] = {
    TEMPERATURE: _Rows.temperature_bound,
    OFFSET: _Rows.offset_bound,
}


def _check_param(name: str, got: float, truth: GradTruth, j: int, bound: np.ndarray,
                 rows_total: int, uw: float, tiny: float, budget: GradBudget,
                 nan_row: bool) -> ParamCheck:
    """One parameter's gradient against the truth: NaN where the input has a NaN row (docs/
    definitions.md section 3), else within its bound's budget."""
    if nan_row:
        ok = math.isnan(got)
        return ParamCheck(got, math.nan, 0.0 if ok else math.inf, 0.0, ok,
                          "" if ok else f"special: d{name} is {got!r}, NaN expected (NaN row)")
    expected = math.fsum([*truth.dp_hi[:, j].tolist(), *truth.dp_lo[:, j].tolist()])
    contrib = np.abs(truth.dp_hi[:, j]).sum()
    # Contributions below the working precision's normal range may underflow: tiny covers it.
    allowed_abs = budget.scale * (budget.b * float(bound.sum())
                                  + (math.log2(max(rows_total, 1)) + 2) * uw * contrib + tiny)
    scale = max(abs(expected), tiny)
    allowed_rel = float(allowed_abs / scale)
    if not math.isfinite(got):
        return ParamCheck(got, expected, math.inf, allowed_rel, False,
                          f"special: d{name} is {got!r}, a finite value expected")
    rel = abs(got - expected) / scale
    ok = bool(rel <= allowed_rel)
    reason = "" if ok else (f"accuracy: d{name} relative error {rel:.3g} > budget "
                            f"{allowed_rel:.3g} (expected {expected:.9g}, got {got:.9g})")
    return ParamCheck(got, expected, rel, allowed_rel, ok, reason)


def nan_rows(truth: GradTruth, x: np.ndarray) -> np.ndarray:
    """(rows,) True where x's row holds a NaN, checked or not (derived once per case): a
    NaN row's y is NaN, and it makes the parameters' gradients NaN."""
    return truth.derived("nan_rows", lambda: np.isnan(x.astype(np.float64)).any(axis=1))


def _param_checks(fn: Function, dparams: dict[str, float], truth: GradTruth, rows: _Rows,
                  key: tuple, rows_total: int, budget: GradBudget, nan_row: bool
                  ) -> dict[str, ParamCheck]:
    """Each parameter's gradient judged against its bound (by the role the Function gives
    the parameter), the bound derived once per case (key)."""
    checks: dict[str, ParamCheck] = {}
    for j, p in enumerate(fn.params):
        if p.role not in BOUNDS:
            raise ValueError(f"{fn.name}: parameter {p.name} has no gradient bound "
                             "(declare its role: temperature or offset)")
        bound = truth.derived(("bound", p.role, *key), partial(BOUNDS[p.role], rows))
        checks[p.name] = _check_param(p.name, dparams[p.name], truth, j, bound, rows_total,
                                      rows.uw, rows.tiny, budget, nan_row)
    return checks


def dx_ulp(truth: GradTruth, fmt: FloatFormat) -> np.ndarray:
    """ulps of the exact dx in fmt; NaN and inf (a NaN row, a gradient past float64) as 0 and
    the largest float64, which the scoring of those positions does not read."""
    return ulp_of(np.nan_to_num(truth.dx_hi), np.nan_to_num(truth.dx_lo), fmt)


def check_backward(
    x: np.ndarray, g: np.ndarray, dx: np.ndarray, dparams: dict[str, float], truth: GradTruth,
    fmt: FloatFormat, function: str, params: dict[str, float],
    budget: GradBudget = GRAD_BUDGET,
) -> tuple[CheckResult, dict[str, ParamCheck]]:
    """Score dx in ulps (and dtau, dbeta relatively) against the exact gradients."""
    for bad, why in ((dx.shape != x.shape, f"shape {dx.shape}, expected {x.shape}"),
                     (dx.dtype != fmt.numpy, f"dtype {dx.dtype}, expected {fmt.numpy}")):
        if bad:
            return CheckResult(False, f"returned dx of {why}"), {}
    fn = get_function(function)
    # what depends on the case alone (the truth, x, g) is derived once for every kernel
    key = (fmt.name, function, tuple(sorted(params.items())), budget)
    rows = truth.derived(("rows", *key), lambda: _Rows(x, g, truth, fmt, fn, params, budget.own))
    ulp = truth.derived(("dx_ulp", fmt.name), lambda: dx_ulp(truth, fmt))
    allowed = truth.derived(("dx_allowed", *key), lambda: rows.dx_allowed(truth, ulp, budget))
    want_nan = truth.derived("dx_nan", lambda: np.isnan(truth.dx_hi))
    got = checked(dx, truth)
    s = score(got, truth.dx_hi, truth.dx_lo, truth.dzero, want_nan, ulp, fmt)
    err, missing_nan, zero_broken = s.err, s.missing_nan, s.zero_broken
    with np.errstate(invalid="ignore"):
        frac = err / allowed
    frac[np.isnan(frac)] = np.inf  # inf / inf: an infinite dx is never fine
    over = (frac > 1) & ~want_nan & ~zero_broken
    failures = {"nan_not_propagated": int(missing_nan.sum()),
                "masked_not_zero": int(zero_broken.sum()), "over_budget": int(over.sum())}

    checks = _param_checks(fn, dparams, truth, rows, key, x.shape[0], budget,
                           bool(nan_rows(truth, x).any()))
    bad_params = [c for c in checks.values() if not c.passed]
    failures.update({f"d{name}": 1 for name, c in checks.items() if not c.passed})
    failures = {k: v for k, v in failures.items() if v}

    # a policy failure is reported apart from accuracy
    exact_zero = truth.derived("dx_exact_zero",
                               lambda: (truth.dx_hi == 0) & (truth.dx_lo == 0))
    max_ulp, max_frac, at = worst_within(err, frac, ~want_nan & ~zero_broken, exact_zero)
    special = missing_nan | zero_broken
    special_params = [c for c in bad_params if c.reason.startswith("special")]
    if special.any() or special_params:
        worst, reason = None, special_params[0].reason if special_params else ""
        if special.any():
            k, j = np.argwhere(special)[0]
            worst = position(x, got, truth, k, j, truth.dx_hi, truth.dx_lo, err[k, j],
                             allowed[k, j], float(ulp[k, j]))
            place = zero_place(str(truth.kind[k]), float(x[truth.rows[k], j]),
                               gradient=True)
            reason = (f"special: NaN in row {worst['row']} not propagated to dx"
                      if missing_nan[k, j] else
                      f"special: dx not exactly 0 {place} (got {worst['got']})")
        return CheckResult(False, reason, max_ulp, max_frac, False, worst, failures), checks
    worst = None if at is None else position(x, got, truth, *at, truth.dx_hi, truth.dx_lo,
                                             err[at], allowed[at], float(ulp[at]))
    if over.any():
        assert worst is not None
        reason = f"accuracy: dx {describe_error(worst)}"
    elif bad_params:
        reason = bad_params[0].reason
    else:
        return CheckResult(True, "", max_ulp, max_frac, True, worst, failures), checks
    return CheckResult(False, reason, max_ulp, max_frac, True, worst, failures), checks
