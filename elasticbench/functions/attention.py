"""Attention functions: a row function of the family applied to scaled dot-product scores.

    s_ij = scale * q_i . k_j      (keys hidden by the causal mask are not there)
    out_i = sum_j w_ij v_j,       w_i = row(s_i)   (docs/attention.md section 1)

`elastic_attention` takes Elastic-Softmax as its row function; `softmax_attention` takes
softmax, which is what torch.nn.functional.scaled_dot_product_attention (SDPA) computes, so
SDPA is verified (and timed as the baseline) under that name. An attention function is a
kernel function of its own kind: its kernels take (q, k, v) rather than one array of rows
(the kernel contract is docs/attention.md section 4), and `verify` and `run` give them their
own jobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import elastic, softmax
from .base import Function, Param

CAUSAL = Param("causal", 0.0, 0.0, False, (0.0, 1.0),
               "1: query i sees keys j <= i (top-left, as SDPA's is_causal); 0: every key")


@dataclass(frozen=True)
class AttentionFunction:
    """out = row(scale * q @ k^T) @ v, per batch and head; `row` is a family member."""

    name: str
    summary: str
    row: Function
    params: tuple[Param, ...]

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
        """Names and ranges checked (causal must be 0 or 1), defaults filled in."""
        unknown = sorted(set(params) - set(self.param_names))
        if unknown:
            raise ValueError(f"{self.name} has no parameter {unknown[0]!r} "
                             f"(parameters: {', '.join(self.param_names)})")
        out = self.defaults()
        for p in self.params:
            if p.name in params:
                out[p.name] = p.validate(params[p.name])
        if out["causal"] not in (0.0, 1.0):
            raise ValueError(f"causal must be 0 or 1, got {params.get('causal')!r}")
        return out

    def param_grid(self, overrides: dict[str, list[float]] | None = None) -> list[dict]:
        """The cross product of each parameter's grid (or the given lists), validated."""
        combos: list[dict] = [{}]
        for p in self.params:
            values = list((overrides or {}).get(p.name, p.grid))
            combos = [{**c, p.name: v} for c in combos for v in values]
        return [self.validate_params(c) for c in combos]


ELASTIC_ATTENTION = AttentionFunction(
    name="elastic_attention",
    summary="Elastic-Softmax attention: elastic(scale * q @ k^T) @ v, per head",
    row=elastic.FUNCTION,
    params=(*elastic.FUNCTION.params, CAUSAL),
)

SOFTMAX_ATTENTION = AttentionFunction(
    name="softmax_attention",
    summary="softmax attention (what SDPA computes): softmax(scale * q @ k^T) @ v",
    row=softmax.FUNCTION,
    params=(CAUSAL,),
)
