"""Error budgets for attention outputs and gradients (docs/attention.md section 5 derives them).

An output out_ie = sum_j w_ij v_je is a weighted mean of v, so the error a kernel makes in
it is the error of each weight, carried by |v|: with eps_ij the relative error of w_ij in
units of the working precision's unit roundoff u_w,

    |d out_ie| <= 2 u_w sum_j w_ij |v_je| eps_ij  +  r ulp(out_ie)  +  l 2 u_out sum_j w_ij |v_je|
    eps_ij = a + b |z_ij| + c zbar_i + g (sigma_ij + sigmabar_i) / tau + d log2(Lk)

- a + b|z_ij| + c zbar_i are the row budget's terms (numerics/budgets/row_budgets.py): the exponent
  argument z_ij = (s_ij - m_i)/tau rounded, and the denominator's weighted mean of |z|;
- sigma_ij = scale sum_d |q_id k_jd| bounds the rounding of the score s_ij (a dot product of
  length D costs about g = log2(D) + 2 roundings, blocked summation), and it enters z
  divided by tau; sigmabar_i is its weighted mean, through the denominator;
- d log2(Lk) for summing the Lk terms of the denominator and of p @ v;
- r ulp(out) for the final rounding to the output format (1, as for rows);
- l 2 u_out sum_j w_ij |v_je|: a low-precision kernel may round the weights once to its
  format before p @ v, as flash kernels do (l = 1 for fp16 and bf16, 0 for fp32, fp64);
  a weight below the format's normal range lands on its subnormal step instead.

sum_j w_ij |v_je| is the conditioning: when the v_je cancel, out_ie is small and the
allowance in its ulps grows accordingly, as it must. The gradients follow the same way
from ds_ij = w_ij (dp_ij - c_i)/tau (docs/attention.md section 2); see `gradient_allowance`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from elasticbench.harness.functions import AttentionFunction
from elasticbench.harness.numerics.dtypes import FloatFormat
from elasticbench.harness.numerics.truth.attention_values import AttentionTruth


@dataclass(frozen=True)
class AttentionBudget:
    """The coefficients of the allowance (module docstring); in units of u_w unless said."""

    a: float
    b: float
    c: float
    d: float
    r: float  # ulps of the output format: the final rounding
    l: float  # weights rounded to the output format once (units of 2 u_out)  # noqa: E741

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


ATTENTION_BUDGETS: dict[str, AttentionBudget] = {
    "fp64": AttentionBudget(a=4.0, b=3.0, c=1.0, d=1.0, r=1.0, l=0.0),
    "fp32": AttentionBudget(a=4.0, b=3.0, c=1.0, d=1.0, r=1.0, l=0.0),
    "fp16": AttentionBudget(a=4.0, b=3.0, c=1.0, d=1.0, r=1.0, l=1.0),
    "bf16": AttentionBudget(a=4.0, b=3.0, c=1.0, d=1.0, r=1.0, l=1.0),
}


EXP, NORMALIZE, SIGMOID, SIGNED = "exp", "normalize", "sigmoid", "signed"  # the weights' forms


def form_of(fn: AttentionFunction) -> str:
    """Which budget a function's weights take: the exp family's (a temperature, a shift),
    a weight-normalize member's (a(s) / D, no exponential), sigmoid's (no denominator) or
    cog's (signed: softmax of |s| times sign(s))."""
    if not fn.normalized:
        return SIGMOID
    if fn.signed:
        return SIGNED
    return NORMALIZE if fn.row.weights is not None else EXP


def _visible(lq: int, lk: int, causal: bool) -> np.ndarray:
    """(Lq, Lk) bool: the keys each query sees (causal: top-left, j <= i)."""
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    return j <= i if causal else np.ones((lq, lk), dtype=bool)


def _shape(name: str, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A weight-normalize member's a(s), |a'(s)| and |a''(s) / a'(s)| over float64 scores."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if name == "symax":
            return np.abs(s), np.ones_like(s), np.zeros_like(s)
        if name == "stablemax":
            neg = s < 0
            r = 1 / (1 - np.minimum(s, 0.0))
            return (np.where(neg, r, s + 1), np.where(neg, r * r, 1.0),
                    np.where(neg, 2 * r, 0.0))
    raise ValueError(f"no attention budget for the weight-normalize member {name!r}")


def work_unit(fmt: FloatFormat) -> float:
    """u_w: the unit roundoff kernels work in (fp64 for fp64, fp32 for the rest)."""
    return 2.0**-53 if fmt.name == "fp64" else 2.0**-24


class Conditioning:
    """What every allowance is built from, in float64 (bounds need no more precision)."""

    def __init__(self, fn: AttentionFunction, params: dict[str, float], q: np.ndarray,
                 k: np.ndarray, v: np.ndarray, scale: float, truth: AttentionTruth,
                 fmt: FloatFormat, budget: AttentionBudget, bias: np.ndarray | None = None,
                 work: FloatFormat | None = None):
        """bias: a mask's (B, H, Lq, Lk), -inf where hidden; its finite values are added to
        the scores, and their magnitude joins sigma (the kernel's addition rounds once).
        work: the format the kernel computes in where it is not work_unit's (the own
        contract: numerics/budgets/attention_own.py)."""
        self.fmt, self.bud, self.scale = fmt, budget, scale
        self.uw, self.uo = work_unit(fmt), fmt.unit_roundoff
        self.sub = 2.0**-149 if self.uw > 2.0**-53 else 2.0**-1074  # the work's subnormal step
        self.tiny = 2.0**-126 if self.uw > 2.0**-53 else 2.0**-1022  # and smallest normal
        if work is not None:
            self.uw, self.sub, self.tiny = work.unit_roundoff, work.min_ulp, 2.0**work.emin
        self.sub_out = fmt.min_ulp  # the output format's: where a weight rounded to it lands
        self.form = form_of(fn)
        self.tau = fn.row.temperature(params)
        self.offset = fn.row.offset(params)
        # a NaN query's weights are all NaN, but sigmoid's each alone: the others count
        finite = (truth.kind != "nan")[..., None] | (self.form == SIGMOID)
        self.w = np.where(finite, np.nan_to_num(truth.w, nan=0.0), 0.0)
        self.zabs = np.where(finite, truth.zabs, 0.0)
        self.zbar = np.where(truth.kind != "nan", truth.zbar, 0.0)
        q0 = np.nan_to_num(q, nan=0.0, posinf=0.0, neginf=0.0)
        k0 = np.nan_to_num(k, nan=0.0, posinf=0.0, neginf=0.0)
        aq, ak = np.abs(q0), np.abs(k0)
        self.v0 = np.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0)
        self.av = np.abs(self.v0)
        self.aq, self.ak = aq, ak
        add = 0.0 if bias is None else np.where(np.isfinite(bias), bias, 0.0)
        self.sigma = scale * aq @ np.swapaxes(ak, -1, -2) + np.abs(add)  # (B, H, Lq, Lk)
        total = self.w.sum(-1)
        self.sigbar = np.where(total > 0, (self.w * self.sigma).sum(-1) /
                               np.where(total > 0, total, 1), 0.0)
        d, lk = q.shape[3], k.shape[2]
        self.g = math.log2(max(d, 1)) + 2
        self.lq, self.lk = q.shape[2], lk
        # from float64 scores (for bounds only; a non-finite input read as 0: the rows it
        # reaches are NaN or infinite, with no finite gradient to bound)
        s = scale * q0 @ np.swapaxes(k0, -1, -2) + add
        kept = self.w > 0
        self.kept = kept.astype(np.float64)
        self.sub_ds = self.kept * self.sub / (2 * self.uw)  # a weight's subnormal step
        self.flip = np.zeros_like(self.w)
        self.jump = np.zeros_like(self.w)  # cog: p at an exact zero score (its ds is set apart)
        self.mt = self.qd = self.sink = np.zeros(self.w.shape[:-1])
        self.sign = np.ones_like(self.w)
        if self.form == NORMALIZE:
            self._normalize(fn, params, s, truth, bias)
            return
        if self.form == SIGMOID:
            self._sigmoid()
            return
        if self.form == SIGNED:
            self._signed(params, s, truth, bias)
            return
        self.eps = (budget.a + budget.b * self.zabs + budget.c * self.zbar[..., None]
                    + self.g * (self.sigma + self.sigbar[..., None]) / self.tau
                    + budget.d * math.log2(max(lk, 1)))
        self.weps = self.w * self.eps
        # a query whose weights are a limit (+inf scores) has exactly zero gradients
        moving = (truth.kind == "finite")[..., None]
        self.dw = np.where(moving, self.w / self.tau, 0.0)
        self.dwe = self.dw * self.eps
        self.sub_ds = np.where(moving, self.sub_ds / self.tau, 0.0)
        # m_i / tau and each query's sink share
        m = np.maximum(np.where(kept, s, -np.inf).max(-1, initial=-np.inf), 0.0)
        self.mt = np.where(np.isfinite(m), m, 0.0) / self.tau
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            e = np.where(kept, np.exp(np.minimum((s - m[..., None]) / self.tau, 0)), 0).sum(-1)
            em = np.exp(-self.mt)
            den = e + self.offset * em
            self.qd = np.where(den > 0, em / np.where(den > 0, den, 1), 0.0)
        self.qd = np.where(moving[..., 0], self.qd, 0.0)
        self.sink = self.offset * self.qd

    def _normalize(self, fn: AttentionFunction, params: dict[str, float], s: np.ndarray,
                   truth: AttentionTruth, bias: np.ndarray | None) -> None:
        """weps, dw, dwe and flip of a weight-normalize member, w_j = a(s_j) / D,
        D = eta + sum_visible a(s) (docs/numerics.md section 7.2)."""
        bud, g = self.bud, self.g
        visible = np.broadcast_to(_visible(self.lq, self.lk, bool(params.get("causal", 0.0))),
                                  s.shape)
        if bias is not None:
            visible = visible & np.isfinite(bias)
        finite = (truth.kind == "finite")[..., None] & visible
        a, slope, curve = _shape(fn.row.name, s)
        den = np.where(finite, a, 0.0).sum(-1, keepdims=True) + fn.row.weight_offset(params)
        inv = np.where(finite & (den > 0), 1 / np.where(den > 0, den, 1), 0.0)
        rho = self.sigma * slope * inv  # a score's error, through a(s), over D
        eps_d = bud.a + bud.d * math.log2(max(self.lk, 1)) + g * rho.sum(-1, keepdims=True)
        self.eps_d = eps_d[..., 0]
        self.inv_d = inv.max(-1)  # 1/D per query (0 where the query's row is not finite)
        self.weps = self.w * eps_d + g * rho
        self.dw = slope * inv  # ds = a'(s)/D (dp - c)
        self.dwe = self.dw * (eps_d + bud.a + g * self.sigma * curve)
        if fn.row.name == "symax":  # |s| within its own error of 0: sign(s) may come out flipped
            near = np.abs(s) <= 2 * g * self.uw * self.sigma
            self.flip = np.where(finite & near, 2 * inv, 0.0)

    def _signed(self, params: dict[str, float], s: np.ndarray, truth: AttentionTruth,
                bias: np.ndarray | None) -> None:
        """weps, dw, dwe and flip of cog, w = sign(s) p, p = softmax(|s|) over the visible
        keys (docs/numerics.md section 8.2): p is the exp family's weight at tau = 1 on |s|
        (|s| exact, the same rounding of the score), so its relative error is eps; the
        allowance is built from p = |w| (and from p at a zero score, whose w is 0 but
        whose ds = p g is not); where |s| lies within the score's rounding of 0 the kernel's
        sign may differ, a weight off by 2p (flip)."""
        bud, g = self.bud, self.g
        visible = np.broadcast_to(_visible(self.lq, self.lk, bool(params.get("causal", 0.0))),
                                  s.shape)
        if bias is not None:
            visible = visible & np.isfinite(bias)
        moving = (truth.kind == "finite")[..., None]
        finite = moving & visible
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            e = np.where(finite, np.exp(-truth.zabs), 0.0)
            den = e.sum(-1, keepdims=True)
            p = np.where(finite, e / np.where(den > 0, den, 1.0), 0.0)
        # a query of infinite scores: its weights are the limit's, |w| = 1/n
        self.w = np.where(moving, p, np.abs(self.w))
        total = self.w.sum(-1)
        self.sigbar = np.where(total > 0, (self.w * self.sigma).sum(-1)
                               / np.where(total > 0, total, 1), 0.0)
        self.kept = (self.w > 0).astype(np.float64)
        self.sub_ds = np.where(moving, self.kept * self.sub / (2 * self.uw), 0.0)
        self.eps = (bud.a + bud.b * self.zabs + bud.c * self.zbar[..., None]
                    + g * (self.sigma + self.sigbar[..., None])
                    + bud.d * math.log2(max(self.lk, 1)))
        # a score of no nonzero product (sigma = 0) is exactly 0 in every kernel: its sign sure
        near = (np.abs(s) <= 2 * g * self.uw * self.sigma) & (self.sigma > 0)
        # (flip is in units of 2 u_w, as weps: a sign off is 2 p absolutely)
        self.flip = np.where(finite & near, 2 * self.w, 0.0) / (2 * self.uw)
        # at an exact zero score the weight jumps from -p to +p: the reference's ds is the mean
        # one-sided derivative p g, autograd's (sign and abs have derivative 0 at 0) is 0;
        # either is right, so ds may be off by p |g| at such keys (in units of 2 u_w, as A)
        self.jump = np.where(finite & (s == 0), self.w, 0.0) / (2 * self.uw)
        self.weps = self.w * self.eps + self.flip
        self.dw = np.where(moving, self.w, 0.0)  # ds = p (g - sign(s) c)
        self.dwe = self.dw * self.eps
        self.sign = np.sign(np.nan_to_num(truth.w))

    def _sigmoid(self) -> None:
        """weps, dw and dwe of sigmoid(s + bias): no denominator; the argument's error (its
        rounding b|x|, the score's g sigma) enters the weight times 1 - w
        (docs/numerics.md section 7.3)."""
        bud = self.bud
        self.eps = (bud.a + bud.d * math.log2(max(self.lk, 1))
                    + (1 - self.w) * (bud.b * self.zabs + self.g * self.sigma))
        self.weps = self.w * self.eps
        self.dw = self.w * (1 - self.w)  # ds = w (1 - w) dp
        self.dwe = self.w * (self.eps + 2)  # 1 - w rounded, and the product

    def out_allowance(self, out_ulp: np.ndarray) -> np.ndarray:
        """Absolute allowance for out (B, H, Lq, Dv), given ulp(out) in the format."""
        wv = self.w[..., None] * self.av[:, :, None, :, :]  # (B, H, Lq, Lk, Dv)
        werr = np.einsum("bhij,bhje->bhie", self.weps, self.av)
        floor = np.einsum("bhij,bhje->bhie", self.kept, self.av)  # weights near underflow
        return (2 * self.uw * werr + self.sub * floor + self.bud.r * out_ulp
                + self.bud.l * (2 * self.uo * wv.sum(3) + self.sub_out * floor))


def gated_allowance(cond: Conditioning, factor: np.ndarray, out_ulp: np.ndarray,
                    value: np.ndarray, value_ulp: np.ndarray) -> np.ndarray:
    """Absolute allowance for a product `value` = out * factor formed by a kernel from its
    own out (docs/numerics.md section 8.3): the gated output out * g (factor = g) or the
    gate's gradient dY * out (factor = dY). out's allowance (out_ulp: ulp of the exact
    ungated out, so a kernel that rounds out to its format first is covered) carried by
    |factor|, the product's rounding in the work precision and the final one in the format
    (value_ulp: ulp of the exact product)."""
    f = np.abs(np.nan_to_num(factor, nan=0.0, posinf=0.0, neginf=0.0))
    return (f * cond.out_allowance(out_ulp) + 2 * cond.uw * np.abs(np.nan_to_num(value))
            + cond.bud.r * value_ulp)


def gradient_allowance(cond: Conditioning, dout: np.ndarray, out: np.ndarray,
                       ulps: dict[str, np.ndarray], rounded_dout: bool = False
                       ) -> dict[str, np.ndarray]:
    """Absolute allowances for dq, dk, dv (elementwise; ulps[name] is ulp of the exact
    value in the format) and for each row parameter's gradient per (batch, head) ("tau",
    "beta"), carried from the error of ds_ij = w_ij (dp_ij - c_i)/tau:

        |d ds_ij| <= 2 u_w A_ij + 2 u_out l L_ij,
        A_ij = w_ij/tau ((|dp_ij| + |c_i|) eps_ij + g (P_ij + C_i)),
        L_ij = w_ij C_i / tau + |ds_ij|

    with P_ij = sum_e |dO_ie v_je| and C_i = sum_e |dO_ie out_ie| the conditioning of the dot
    products dp_ij = dO_i . v_j and c_i = dO_i . out_i; a low-precision kernel pays L_ij for
    out saved in its format and for ds rounded once to it before the matmuls (as p is
    forward). dq, dk and dv are sums of ds (or w) times q, k, dO. rounded_dout: the kernel's
    dO is dY * g of a gated case, rounded once to the format (and the reference's, in
    float64, for fp64): 2 u_out of every term that dO enters (docs/numerics.md section 8.3).
    """
    c, b = cond, cond.bud
    two_uw, two_uo = 2 * c.uw, 2 * c.uo
    ado = np.nan_to_num(np.abs(dout), nan=0.0, posinf=0.0)
    do0 = np.nan_to_num(dout, nan=0.0, posinf=0.0, neginf=0.0)
    out0 = np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)
    vt = np.swapaxes(c.v0, -1, -2)
    dp = do0 @ vt  # (B, H, Lq, Lk)
    P = ado @ np.swapaxes(c.av, -1, -2)
    ci = (do0 * out0).sum(-1)[..., None]
    Ci = (ado * np.abs(out0)).sum(-1)[..., None]
    if c.form == SIGMOID:  # no denominator: ds = w (1 - w) dp, no c_i
        ci, Ci = np.zeros_like(ci), np.zeros_like(Ci)
    # c_i's error: its dot product's, and every weight's error carried by |v| (or by |dp|
    # when a kernel forms c_i = sum_j w_ij dp_ij; P_ij >= |dp_ij|)
    CeP = ((c.weps + c.w * c.g) * P).sum(-1, keepdims=True)
    if c.form == SIGMOID:
        CeP = np.zeros_like(CeP)
    # a weight near the work format's underflow is off by its subnormal step, not relatively
    floor = c.sub_ds
    A = (c.dwe * (np.abs(dp) + np.abs(ci)) + c.dw * (c.g * (P + Ci) + CeP)
         + floor * (np.abs(dp) + np.abs(ci) + CeP)
         + (c.flip if c.form == SIGNED else c.flip / two_uw)  # (symax's: absolute)
         * (np.abs(dp) + np.abs(ci))
         + c.jump * np.abs(dp))
    ds = c.dw * np.abs(dp - (c.sign * ci if c.form == SIGNED else ci))
    # out saved in the format (c_i), and p and ds rounded once to it for the matmuls
    L = b.l * (c.dw * Ci + ds + c.kept * c.sub_out / two_uo)  # (a subnormal lands on its step)
    if rounded_dout:  # dp and c_i off by u_out of P and C (times 2: the reference's too)
        L = L + c.dw * (P + Ci)
    lg_q, lg_k = b.d * math.log2(max(c.lq, 1)), b.d * math.log2(max(c.lk, 1))
    e_q = A + ds * (c.g + lg_k)
    e_k = A + ds * lg_q
    out: dict[str, np.ndarray] = {}
    out["dq"] = (c.scale * (two_uw * e_q + two_uo * L) @ c.ak + b.r * ulps["dq"])
    out["dk"] = (c.scale * np.swapaxes(two_uw * e_k + two_uo * L, -1, -2) @ c.aq
                 + b.r * ulps["dk"])
    # a weight near the work format's underflow is off by its subnormal step (the forward's
    # `sub * floor`): alone in dv_j when one query sees key j (decoding)
    wt_do = np.swapaxes(two_uw * (c.weps + c.w * lg_q) + two_uo * b.l * c.w
                        + c.kept * c.sub + b.l * c.kept * c.sub_out
                        + (two_uo * c.w if rounded_dout else 0.0), -1, -2) @ ado
    out["dv"] = wt_do + b.r * ulps["dv"]
    z = c.zabs
    tiny = c.tiny
    if c.form == NORMALIZE:
        # deta = -sum_i c_i / D_i: D's error, c_i's (its dot product, the weights'), the sum
        aci = np.abs(ci[..., 0])
        out["eta"] = (two_uw * (c.inv_d * (aci * (c.eps_d + 1 + lg_q) + c.g * Ci[..., 0]
                                            + CeP[..., 0])).sum(-1)
                      + two_uo * b.l * (c.inv_d * Ci[..., 0]).sum(-1) + tiny)
        return out
    if c.form == SIGNED:  # cog has no row parameter
        return out
    if c.form == SIGMOID:
        # dbias = sum_ij ds_ij: every ds's error, and the sum of Lq Lk terms
        out["bias"] = (two_uw * (A + ds * math.log2(max(c.lq * c.lk, 1))).sum((-1, -2))
                       + two_uo * L.sum((-1, -2)) + tiny)
        return out
    sink_t = (np.abs(ci[..., 0]) * (c.zbar + np.abs(c.mt) + 3) + c.g * Ci[..., 0]
              + CeP[..., 0])
    out["tau"] = (two_uw * ((A * z + ds * (b.b * z + c.g * c.sigma / c.tau + c.eps)).sum((-1, -2))
                            + (sink_t * c.sink * np.abs(c.mt) / c.tau).sum(-1)
                            + math.log2(max(c.lq * c.lk, 1)) * (ds * z).sum((-1, -2)))
                  + two_uo * ((L * z).sum((-1, -2))
                              + b.l * (Ci[..., 0] * c.sink * np.abs(c.mt) / c.tau).sum(-1))
                  + tiny)
    out["beta"] = (two_uw * ((c.qd * sink_t).sum(-1)
                             + lg_q * (c.qd * np.abs(ci[..., 0])).sum(-1))
                   + two_uo * b.l * (c.qd * Ci[..., 0]).sum(-1) + tiny)
    return out
