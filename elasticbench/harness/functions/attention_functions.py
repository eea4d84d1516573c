"""Attention functions: a row function of the family applied to scaled dot-product scores.

    s_ij = scale * q_i . k_j      (keys hidden by the causal mask are not there)
    out_i = sum_j w_ij v_j,       w_i = row(s_i)   (docs/attention.md section 1)

`elastic_attention` takes Elastic-Softmax as its row function; `softmax_attention` takes
softmax, which is what torch.nn.functional.scaled_dot_product_attention (SDPA) computes, so
SDPA is verified (and timed as the baseline) under that name. `softmax1_attention`,
`symax_attention`, `stablemax_attention` and `sigmoid_attention` take the other members
(sigmoid: an elementwise weight with no normalizer, attention only; docs/attention.md
section 9), and `cog_attention` the signed cog weights (attention only, functions/cog.py); each names its fused weight (attention/weights.py Weight, by name). An attention function is a
kernel function of its own kind: its kernels take (q, k, v) rather than one array of rows
(the kernel contract is docs/attention.md section 4), and `verify` and `run` give them their
own jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from elasticbench.harness.functions import (
    cog,
    elastic,
    sigmoid,
    softmax,
    softmax1,
    stablemax,
    symax,
)
from elasticbench.harness.functions.definition import Function, Param, RowGrad

CAUSAL = Param("causal", 0.0, 0.0, False, (0.0, 1.0),
               "1: query i sees keys j <= i (top-left, as SDPA's is_causal); 0: every key")
# A gated case (docs/attention.md section 5): the kernel is given a gate tensor g
# (batch, heads, length_q, value_dim) in (0, 1) and returns out * g (and, backward, d gate);
# only kernels that declare a `gate` parameter are given gated cases.
GATE = Param("gate", 0.0, 0.0, False, (0.0, 1.0),
             "1: the output gated elementwise by a given sigmoid gate; 0: ungated")
BINARY = ("causal", "gate")  # the attention parameters that are switches, 0 or 1


@dataclass(frozen=True)
class AttentionFunction:
    """out = row(scale * q @ k^T) @ v, per batch and head; `row` is a family member."""

    name: str
    summary: str
    row: Function
    params: tuple[Param, ...]
    # the fused kernels' weight, a member of attention/weights.py Weight by name (None:
    # softmax, SDPA's; the name keeps this layer below elasticbench.attention)
    weight: str | None = None
    # (scores, g, **row params) -> RowGrad: the exact row gradient the references use where
    # the row function has none of its own (the rows kind verifies symax's and stablemax's
    # forward only)
    row_gradient: Callable[..., RowGrad] | None = None
    # weights of either sign (cog): a zero weight (a zero score) still has a gradient,
    # and a weight's size is |w|
    signed: bool = False

    @property
    def gradient_row(self) -> Callable[..., RowGrad]:
        """The exact gradient of the row function, as Function.gradient_row takes it."""
        grad = self.row_gradient or self.row.gradient_row
        if grad is None:
            raise ValueError(f"{self.name} has no gradient reference")
        return grad

    @property
    def normalized(self) -> bool:
        """Whether a query's weights share one denominator (all but sigmoid)."""
        return self.row.normalized

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def row_params(self) -> tuple[str, ...]:
        """The parameters that belong to the row function (tau, beta), not to attention."""
        return self.row.param_names

    def defaults(self) -> dict[str, float]:
        return {p.name: p.default for p in self.params}

    def validate_params(self, params: dict[str, object]) -> dict[str, float]:
        """Names and ranges checked (causal and gate must be 0 or 1), defaults filled in."""
        unknown = sorted(set(params) - set(self.param_names))
        if unknown:
            raise ValueError(f"{self.name} has no parameter {unknown[0]!r} "
                             f"(parameters: {', '.join(self.param_names)})")
        out = self.defaults()
        for p in self.params:
            if p.name in params:
                out[p.name] = p.validate(params[p.name])
        for name in BINARY:
            if out.get(name, 0.0) not in (0.0, 1.0):
                raise ValueError(f"{name} must be 0 or 1, got {params.get(name)!r}")
        return out

    def param_grid(self, overrides: dict[str, list[float]] | None = None) -> list[dict]:
        """The cross product of each parameter's grid (or the given lists), validated."""
        combos: list[dict] = [{}]
        for p in self.params:
            values = list((overrides or {}).get(p.name, p.grid))
            combos = [{**c, p.name: v} for c in combos for v in values]
        return [self.validate_params(c) for c in combos]


def _over(row: Function, summary: str, **declared: object) -> AttentionFunction:
    """The attention function of a family member: named `<row>_attention`, its parameters
    the row function's, then causal and gate; `declared` the rest (weight, row_gradient,
    signed)."""
    return AttentionFunction(name=f"{row.name}_attention", summary=summary, row=row,
                             params=(*row.params, CAUSAL, GATE), **declared)


# Kernels of these take (q, k, v), not rows: `verify` and `run` give them their own jobs.
ATTENTION_FUNCTIONS: dict[str, AttentionFunction] = {f.name: f for f in (
    _over(elastic.FUNCTION, "Elastic-Softmax attention: elastic(scale * q @ k^T) @ v, per head",
          weight="ELASTIC"),
    _over(softmax.FUNCTION,
          "softmax attention (what SDPA computes): softmax(scale * q @ k^T) @ v"),
    _over(softmax1.FUNCTION,
          "softmax1 attention: exp(s) / (1 + sum exp(s)) @ v, a head may attend to nothing",
          weight="SOFTMAX1"),
    _over(symax.FUNCTION, "symax attention: |s| / (eta + sum |s|) @ v, per head",
          weight="SYMAX", row_gradient=symax.gradient),
    _over(stablemax.FUNCTION,
          "stablemax attention: st(s) / sum st(s) @ v, st = s + 1 (s >= 0), 1/(1 - s) below",
          weight="STABLEMAX", row_gradient=stablemax.gradient),
    _over(sigmoid.FUNCTION,
          "sigmoid attention: sigmoid(s + bias) @ v, no normalizer (FlashSigmoid)",
          weight="SIGMOID"),
    _over(cog.FUNCTION,
          "cog attention: sign(s) exp(|s|) / sum exp(|s|) @ v, signed weights (Lv et al.)",
          weight="COG", signed=True),
)}
