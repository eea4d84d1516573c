"""What a function of the family is: its parameters and its exact (mpmath) definition.

A reference is evaluated one row at a time in mpmath at the working precision set by the
caller. It returns a RowTruth: the exact outputs, which of them are zero by structure
(masked), and the exponent arguments |z_i| and their output-weighted mean that the error
budget is built from (numerics/budgets/row_budgets.py).

Every member of the family gives equal inputs of a row equal outputs (y_i is a weight of
x_i over a row-wide denominator), so a row is evaluated once per distinct value, each
weighted by how often it occurs: a long row with few distinct values (any 16-bit row, a
row of ties) costs what its distinct values cost, not what its length costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np

from elasticbench.domains import Domain

# Why a row's outputs are what they are; kept in the truth and in failure reports.
ROW_FINITE = "finite"
ROW_NAN = "nan"  # a NaN in the row: every output NaN
ROW_INF = "inf"  # +inf logits: 1/k at each of the k, 0 elsewhere
ROW_MASKED = "masked"  # nothing survives (or 0/0): every output exactly 0

# What a parameter is to the exp-normalize form (see Function): its gradient's error bound
# follows from it (verify/backward.py).
TEMPERATURE = "temperature"  # tau in exp((s - m) / tau)
OFFSET = "offset"  # beta in the denominator's constant term beta * exp(-m / tau)
# Roles outside the exp-normalize form (attention's budgets, kinds/attention/scoring.py):
DENOMINATOR = "denominator"  # eta, the constant term of a weight-normalize denominator
SHIFT = "shift"  # bias, added to every argument of an elementwise weight (sigmoid)


def above_minus_inf(x: Any) -> Any:
    """The logits an exp-normalize member keeps by default: all but -inf (and NaN); x is a
    float or an array."""
    return x > -math.inf


@dataclass
class RowTruth:
    """Exact outputs of one row, kept per distinct input value: element i of the row has
    the outputs of entry index[i] (y, zero and zabs read them per element)."""

    group_y: list  # exact output per distinct value: an mpf, or None when it must be NaN
    group_zero: list[bool]  # exactly zero by structure: the kernel must return exactly 0
    group_zabs: list[float]  # |z|, the exponent argument's size (0 where there is no exp)
    zbar: float  # output-weighted mean of |z| over the denominator's terms
    kind: str
    index: np.ndarray  # (n,) int: element i -> its distinct value's entry
    share: Any = 0  # the constant term's share of the denominator, 1 - sum y (an mpf)

    @property
    def y(self) -> list:
        return [self.group_y[i] for i in self.index]

    @property
    def zero(self) -> list[bool]:
        return [self.group_zero[i] for i in self.index]

    @property
    def zabs(self) -> list[float]:
        return [self.group_zabs[i] for i in self.index]

    @classmethod
    def nan(cls, n: int) -> RowTruth:
        return cls([None], [False], [0.0], 0.0, ROW_NAN, np.zeros(n, dtype=np.intp))

    @classmethod
    def masked(cls, n: int) -> RowTruth:
        return cls([mpmath.mpf(0)], [True], [0.0], 0.0, ROW_MASKED, np.zeros(n, dtype=np.intp))

    @classmethod
    def infinite(cls, big: np.ndarray, index: np.ndarray) -> RowTruth:
        """The limit when some terms are infinite: equal shares among the elements whose
        distinct value is big, 0 elsewhere."""
        share = mpmath.mpf(1) / int(np.count_nonzero(big[index]))
        flags = [bool(b) for b in big]
        return cls([share if b else mpmath.mpf(0) for b in flags], [not b for b in flags],
                   [0.0] * len(flags), 0.0, ROW_INF, index)


def distinct(row: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """A row's distinct values (+0.0 and -0.0 are one), each element's entry among them, and
    how many elements each has. A float64 array is grouped by NumPy; a list may hold mpf
    values (finite differences evaluate the definition between floats) and keeps them."""
    if isinstance(row, np.ndarray):
        values, index, counts = np.unique(row.astype(np.float64), return_inverse=True,
                                          return_counts=True)
        return values, index.reshape(-1), counts.tolist()
    first: dict[Any, int] = {}
    entries = [first.setdefault(v, len(first)) for v in row]
    counts = np.bincount(entries, minlength=len(first)).tolist() if entries else []
    values = np.empty(len(first), dtype=object)
    values[:] = list(first)
    return values, np.asarray(entries, dtype=np.intp), counts


@dataclass
class RowGrad:
    """Exact gradients of one row for an upstream gradient g (docs/gradients.md section 1).

    dx[i] is an mpf, or None where it must be NaN; dparams holds this row's contribution to
    the gradient of each parameter (None: NaN). Rows that are not finite (NaN aside) have
    exactly zero gradients: fully masked rows have nothing to move, and a finite change of
    an input never moves the output of a +inf row.
    """

    truth: RowTruth  # the forward truth of the row
    dx: list
    zero: list[bool]  # dx exactly zero by structure (masked positions, non-finite rows)
    dparams: dict

    @classmethod
    def constant(cls, truth: RowTruth, param_names: Sequence[str]) -> RowGrad:
        """Gradients of a row that is NaN (all NaN) or masked/infinite (all exactly 0)."""
        n = len(truth.y)
        if truth.kind == ROW_NAN:
            return cls(truth, [None] * n, [False] * n, dict.fromkeys(param_names))
        zero = mpmath.mpf(0)
        return cls(truth, [zero] * n, [True] * n, dict.fromkeys(param_names, zero))


def centered(
    y: Sequence[Any], g: Sequence[float], keep: Sequence[bool], share: Any
) -> tuple[mpmath.mpf, list]:
    """c = sum_i g_i y_i and g_k - c for every k, exactly.

    For the largest output, when it is alone among the kept, g_k - c is taken as
    sum_{i != k} (g_k - g_i) y_i + g_k share (the same number, since 1 - y_k =
    sum_{i != k} y_i + share, share the constant term's part of the denominator): as y_k
    nears 1, g_k - c cancels to far below any fixed working precision, and this form does not.
    """
    gm = [mpmath.mpf(v) for v in g]
    c = mpmath.fsum(gi * yi for gi, yi in zip(gm, y, strict=True))
    diff = [gk - c for gk in gm]
    kept_y = [(yk, k) for k, (yk, kk) in enumerate(zip(y, keep, strict=True)) if kk]
    if kept_y:
        top = max(yk for yk, _ in kept_y)
        tops = [k for yk, k in kept_y if yk == top]
        if len(tops) == 1:
            k = tops[0]
            diff[k] = mpmath.fsum((gm[k] - gi) * yi for i, (gi, yi) in enumerate(zip(gm, y, strict=True))
                                  if i != k) + gm[k] * share
    return c, diff


def exp_normalize_grad(
    truth: RowTruth, g: Sequence[float], keep: Sequence[bool], scale: float = 1.0
) -> tuple[mpmath.mpf, list, list[bool]]:
    """c = sum_i g_i y_i and dx_k = y_k (g_k - c) * scale on kept positions (0 elsewhere).

    The gradient of every exp-normalize member: the constant term of the denominator
    (beta, or softmax1's 1) only enters through y and its share; g_k - c as `centered`
    forms it (no cancellation at the top output).
    """
    y = truth.y
    c, diff = centered(y, g, keep, truth.share)
    sc = mpmath.mpf(scale)
    dx = [yk * dk * sc if k else mpmath.mpf(0) for yk, dk, k in zip(y, diff, keep, strict=True)]
    return c, dx, [not k for k in keep]


def untempered_exp_grad(truth: RowTruth, row: Sequence[float], g: Sequence[float]) -> RowGrad:
    """The exact gradient of an exp-normalize member with no parameters that keeps every
    logit above -inf (softmax, softmax1: the constant term enters only through y):
    dx_k = y_k (g_k - sum_i g_i y_i); -inf positions get exactly 0, rows that are not
    finite as RowGrad.constant says. truth is the row's forward truth."""
    if truth.kind != ROW_FINITE:
        return RowGrad.constant(truth, ())
    _, dx, zero = exp_normalize_grad(truth, g, [above_minus_inf(v) for v in row])
    return RowGrad(truth, dx, zero, {})


def weight_normalize_grad(
    truth: RowTruth, row: Sequence[Any], g: Sequence[float],
    weight: Callable[[Any], mpmath.mpf], slope: Callable[[Any], mpmath.mpf],
    constant: float = 0.0, constant_name: str | None = None,
) -> RowGrad:
    """Exact gradients of y_i = w(x_i) / D, D = constant + sum_j w(x_j), for upstream g:

        dx_k = w'(x_k) (g_k - c) / D,   c = sum_i g_i y_i,   d constant = -c / D

    (under constant_name, when the constant is a parameter); `slope` is w'. Rows that are
    not finite get RowGrad.constant's gradients (NaN, or exactly 0); g_k - c is formed as
    `centered` forms it, the constant's share of D standing for the exp family's offset.
    """
    names = (constant_name,) if constant_name else ()
    if truth.kind != ROW_FINITE:
        return RowGrad.constant(truth, names)
    xs = list(row)
    w = [weight(v) for v in xs]
    den = mpmath.fsum(w) + constant
    y = [wi / den for wi in w]
    c, diff = centered(y, g, [wi != 0 for wi in w], mpmath.mpf(constant) / den)
    slopes = [slope(v) for v in xs]
    dx = [sl * dk / den for sl, dk in zip(slopes, diff, strict=True)]
    dparams = {constant_name: -c / den} if constant_name else {}
    return RowGrad(truth, dx, [sl == 0 for sl in slopes], dparams)


@dataclass(frozen=True)
class Param:
    """A scalar parameter: its default, its allowed range, the default verification grid, and
    the span (low, high), both > 0, over which verification draws it log-uniformly."""

    name: str
    default: float
    lower: float
    strict: bool  # True: value > lower; False: value >= lower
    grid: tuple[float, ...]
    summary: str
    role: str = ""  # TEMPERATURE or OFFSET in the exp-normalize form, else ""
    span: tuple[float, float] = (1e-3, 1e3)

    def validate(self, value: object) -> float:
        """Return value as a float, or raise ValueError saying what is wrong with it (the
        library's check, elasticbench.domains, so both sides say it the same way)."""
        return Domain(self.name, self.lower, self.strict).check(value)


@dataclass(frozen=True)
class Function:
    """One member of the family, defined once: parameters, exact reference, cost model.

    The exp-normalize members also say what they are in the common form
        y_i = exp((s_i - m)/tau) / (sum_kept exp((s_j - m)/tau) + offset * exp(-m/tau)),
    m = max(max of the kept s, shift_floor): which logits are kept, the shift's floor, and
    which parameters (if any) are the temperature and the offset (else 1 and constant_offset).
    """

    name: str
    summary: str
    reference_row: Callable[..., RowTruth]  # (row of float64 values, **params) -> RowTruth
    params: tuple[Param, ...] = ()
    exps_per_element: int = 1  # exponentials per element in the forward pass
    notes: str = field(default="", compare=False)
    # (row, upstream g, **params) -> RowGrad; None where no gradient is defined
    gradient_row: Callable[..., RowGrad] | None = None
    kept: Callable[[Any], Any] = above_minus_inf  # the mask: a float or an array -> kept?
    shift_floor: float = -math.inf
    constant_offset: float = 0.0  # the offset when no parameter plays it
    # A weight-normalize member (no exponential) gives its weights over an array as a
    # double-double with a relative error bound per weight (the fast reference,
    # numerics/certified/rows_forward.py), and the constant term of its denominator.
    weights: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
    weight_offset: Callable[[Mapping[str, float]], float] = lambda params: 0.0
    # False: each output a weight of its own input alone, no row-wide denominator (sigmoid,
    # an attention weight only): no phase built for normalized rows may take it.
    normalized: bool = True

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def with_role(self, role: str) -> Param | None:
        """The parameter playing role (TEMPERATURE or OFFSET), if one does."""
        return next((p for p in self.params if p.role == role), None)

    def temperature(self, params: Mapping[str, float]) -> float:
        p = self.with_role(TEMPERATURE)
        return float(params[p.name]) if p else 1.0

    def offset(self, params: Mapping[str, float]) -> float:
        p = self.with_role(OFFSET)
        return float(params[p.name]) if p else self.constant_offset

    def defaults(self) -> dict[str, float]:
        return {p.name: p.default for p in self.params}

    def validate_params(self, params: Mapping[str, object]) -> dict[str, float]:
        """Check names and ranges; fill in defaults. Raises ValueError with one clear line."""
        unknown = sorted(set(params) - set(self.param_names))
        if unknown:
            allowed = ", ".join(self.param_names) or "none"
            raise ValueError(
                f"{self.name} has no parameter {unknown[0]!r} (parameters: {allowed})"
            )
        out = self.defaults()
        for p in self.params:
            if p.name in params:
                out[p.name] = p.validate(params[p.name])
        return out

    def param_grid(self, overrides: Mapping[str, Sequence[float]] | None = None) -> list[dict]:
        """The cross product of each parameter's grid (or the given lists), validated."""
        grids = [list((overrides or {}).get(p.name, p.grid)) for p in self.params]
        combos: list[dict] = [{}]
        for p, values in zip(self.params, grids, strict=True):
            combos = [{**c, p.name: p.validate(v)} for c in combos for v in values]
        return combos


# ---------------------------------------------------------------------------------------
# Shared skeletons of the exact definitions. Both take float64 values (exact copies of the
# inputs) and return exact mpf outputs at the caller's mpmath precision.


def has_nan(row: Sequence[float] | np.ndarray) -> bool:
    return bool(np.isnan(np.asarray(row, dtype=np.float64)).any())


def exp_normalize(
    row: Sequence[float] | np.ndarray,
    keep: Callable[[np.ndarray], np.ndarray],
    *,
    tau: float = 1.0,
    shift_floor: float = -math.inf,
    extra: Callable[[mpmath.mpf], mpmath.mpf] | None = None,
) -> RowTruth:
    """y_i = exp((x_i - m) / tau) / (sum_kept exp((x_j - m) / tau) + extra(m)) for kept i.

    keep says, for an array of values, which are kept. m = max(max of kept values,
    shift_floor); extra(m) is the already-rescaled constant term of the denominator
    (beta * exp(-m/tau) for elastic, exp(-m) for softmax1). Positions not kept are exactly 0.
    +inf among the kept gives the limit 1/k; nothing kept (or a zero denominator) gives zeros.
    """
    values, index, counts = distinct(row)
    n = len(index)
    kept = np.asarray(keep(values), dtype=bool)
    if (kept & (values == math.inf)).any():
        return RowTruth.infinite(kept & (values == math.inf), index)
    if not kept.any() and extra is None:
        return RowTruth.masked(n)
    m = max(values[kept].max() if kept.any() else -math.inf, shift_floor)
    if m == -math.inf:  # no kept logit and no floor: the constant term alone
        return RowTruth.masked(n)
    mm, t = mpmath.mpf(m), mpmath.mpf(tau)  # both exact: tau is never rounded as 1/tau
    e: list = []
    zm: list = []  # |z| exact: as a float it overflows to inf for huge logits, and 0 * inf
    for v, k in zip(values.tolist(), kept.tolist(), strict=True):
        if not k:
            e.append(mpmath.mpf(0))
            zm.append(mpmath.mpf(0))
            continue
        z = (mpmath.mpf(v) - mm) / t
        e.append(mpmath.exp(z))
        zm.append(abs(z))
    zabs = [float(za) for za in zm]
    total = mpmath.fsum(c * ev for c, ev in zip(counts, e, strict=True))
    weighted = mpmath.fsum(c * ev * za for c, ev, za in zip(counts, e, zm, strict=True))
    c = extra(mm) if extra is not None else mpmath.mpf(0)
    total += c
    weighted += c * abs(mm / t)
    if total == 0:
        return RowTruth.masked(n)
    share = c / total if extra is not None else mpmath.mpf(0)
    return RowTruth([ev / total for ev in e], [not k for k in kept.tolist()], zabs,
                    float(weighted / total), ROW_FINITE, index, share)


def weight_normalize(
    row: Sequence[float] | np.ndarray,
    weight: Callable[[float], mpmath.mpf],
    *,
    constant: float = 0.0,
) -> RowTruth:
    """y_i = w(x_i) / (constant + sum_j w(x_j)) for nonnegative weights w.

    Infinite weights give the limit 1/k among them; a zero denominator gives zeros;
    weights that are exactly zero are structural zeros of the output.
    """
    values, index, counts = distinct(row)
    w = [weight(v) for v in values.tolist()]
    big = np.array([bool(mpmath.isinf(wi)) for wi in w])
    if big.any():
        return RowTruth.infinite(big, index)
    total = mpmath.fsum(c * wi for c, wi in zip(counts, w, strict=True)) + constant
    if total == 0:
        return RowTruth.masked(len(index))
    return RowTruth([wi / total for wi in w], [wi == 0 for wi in w], [0.0] * len(w), 0.0,
                    ROW_FINITE, index)
