"""Deliberately wrong attention kernels, one bug of docs/attention.md each.

Each is the eager composite with one change (torch, forward, the attention contract), so
catching it shows the attention verification sees that bug and nothing else:

- the offset not rescaled: den = l + beta instead of l + beta exp(-m/tau) (the bug
  docs/definitions.md section 1 describes for rows, inside attention);
- the mask applied after the shift: kept where s - m >= 0, which keeps only the maxima;
- a query that keeps no key divided 0 / 0: NaN where the policy says exactly 0;

and one bug of each of the family's other weights (docs/attention.md section 9), each the
plain form of its weight with one change (the registered composites are their controls):

- symax with its offset eta dropped from the denominator, and symax without the abs;
- sigmoid without its bias;
- softmax1 without its 1 (softmax);
- stablemax with the wrong negative branch: 1 - s, the reciprocal forgotten;
- cog with its sign dropped (softmax of |s|), with |s| replaced by s (plain softmax), and
  with the gate applied before normalization (the gate enters numerator and denominator
  alike and cancels: the output comes out ungated). The cog mutants declare `gate`, so
  verify gives them gated cases too.

`run_attention_selftest` runs them, and the correct kernels, on an attention matrix.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from elasticbench.attention.operands import visible
from elasticbench.harness.kinds.attention.verify_job import given, prepare, verify_attention_one
from elasticbench.harness.kinds.attention.verify_matrix import AttentionMatrix, expand_attention
from elasticbench.harness.numerics.truth.row_truth import DEFAULT_PRECISION
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.selftest.mutants import Mutant
from elasticbench.harness.selftest.outcomes import SelftestOutcome


def _attention(q, k, v, *, tau, beta, scale, causal, rescale: bool = True,
               mask_after_shift: bool = False, guard_empty: bool = True) -> torch.Tensor:
    """Correct Elastic attention (fp64/fp32 work, policy included) unless a flag says not."""
    wd = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q.to(wd) @ k.to(wd).transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~visible(s.shape[-2], s.shape[-1], s.device), -math.inf)
    t, b = tau[..., None, None], beta[..., None, None]
    nan_row = s.isnan().any(-1, keepdim=True)
    keep = s >= 0
    m = torch.where(keep, s, -math.inf).amax(-1, keepdim=True).clamp_min(0)
    if mask_after_shift:
        m = s.nan_to_num(nan=-math.inf).amax(-1, keepdim=True)
        keep = (s - m) >= 0
    e = torch.where(keep, torch.exp((s - m) / t), 0)
    l = e.sum(-1, keepdim=True)  # noqa: E741
    den = l + (b * torch.exp(-m / t) if rescale else b)
    out = (e / den) @ v.to(wd)
    if guard_empty:
        out = torch.where(l > 0, out, 0)
    return out.masked_fill(nan_row, math.nan).to(q.dtype)


def _spec(name: str, **flags: bool) -> KernelSpec:
    def fn(q, k, v, *, tau, beta, scale, causal):
        return _attention(q, k, v, tau=tau, beta=beta, scale=scale, causal=causal, **flags)
    return KernelSpec(name, "elastic_attention", "torch", fn, source="selftest")


ATTENTION_MUTANTS: tuple[Mutant, ...] = (
    Mutant(_spec("attention_beta_not_rescaled", rescale=False),
           "attention: the offset beta added to the shifted sum without exp(-m/tau)"),
    Mutant(_spec("attention_mask_after_shift", mask_after_shift=True),
           "attention: negative scores masked after shifting by the max (keeps only maxima)"),
    Mutant(_spec("attention_empty_query_nan", guard_empty=False),
           "attention: a query that keeps no key divides 0/0 (NaN instead of 0)"),
)



def _family(q, k, v, scale: float, causal: bool, weigh) -> torch.Tensor:
    """weigh(s, hidden) -> the weights over the scores (hidden: the causally hidden keys,
    or None), then weights @ v, a query with no weight giving 0 (the composite's policy)."""
    wd = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q.to(wd) @ k.to(wd).transpose(-1, -2)) * scale
    hidden = ~visible(s.shape[-2], s.shape[-1], s.device) if causal else None
    if hidden is not None:
        s = s.masked_fill(hidden, 0)
    w = weigh(s, hidden)
    if hidden is not None:
        w = w.masked_fill(hidden, 0)
    live = (w != 0).any(-1, keepdim=True) | w.isnan().any(-1, keepdim=True)
    return torch.where(live, w @ v.to(wd), 0).to(q.dtype)


def _normalize(a: torch.Tensor, hidden, offset) -> torch.Tensor:
    a = a if hidden is None else a.masked_fill(hidden, 0)
    den = a.sum(-1, keepdim=True) + offset
    return torch.where(den != 0, a / torch.where(den != 0, den, 1), 0)


def _symax(keep_eta: bool = True, use_abs: bool = True) -> KernelSpec:
    def fn(q, k, v, *, eta, scale, causal):
        offset = eta[..., None, None] if keep_eta else 0.0
        return _family(q, k, v, scale, causal, lambda s, hidden: _normalize(
            s.abs() if use_abs else s, hidden, offset))
    name = "symax_eta_dropped" if not keep_eta else "symax_no_abs"
    return KernelSpec(f"attention_{name}", "symax_attention", "torch", fn, source="selftest")


def _sigmoid_no_bias(q, k, v, *, bias, scale, causal):
    return _family(q, k, v, scale, causal, lambda s, hidden: torch.sigmoid(s))


def _softmax1_no_one(q, k, v, *, scale, causal):
    def weigh(s, hidden):
        s = s if hidden is None else s.masked_fill(hidden, -math.inf)
        return torch.softmax(s, -1)
    return _family(q, k, v, scale, causal, weigh)


def _stablemax_wrong_branch(q, k, v, *, scale, causal):
    return _family(q, k, v, scale, causal, lambda s, hidden: _normalize(
        torch.where(s >= 0, s + 1, 1 - s), hidden, 0.0))


ATTENTION_MUTANTS += (
    Mutant(_symax(keep_eta=False),
           "symax attention: eta dropped from the denominator, |s| / sum |s|"),
    Mutant(_symax(use_abs=False), "symax attention: the abs missing, s / (eta + sum s)"),
    Mutant(KernelSpec("attention_sigmoid_no_bias", "sigmoid_attention", "torch",
                      _sigmoid_no_bias, source="selftest"),
           "sigmoid attention: the bias left out, sigmoid(s)"),
    Mutant(KernelSpec("attention_softmax1_no_one", "softmax1_attention", "torch",
                      _softmax1_no_one, source="selftest"),
           "softmax1 attention: the 1 left out of the denominator (plain softmax)"),
    Mutant(KernelSpec("attention_stablemax_wrong_branch", "stablemax_attention", "torch",
                      _stablemax_wrong_branch, source="selftest"),
           "stablemax attention: the negative branch 1 - s, its reciprocal forgotten"),
)

# the correct form of the elastic mutants' code: it must pass where they fail (the family's
# mutants have the registered composites for theirs)
ATTENTION_CONTROL = _spec("attention_mutant_control")


def _visible_softmax(a: torch.Tensor, hidden) -> torch.Tensor:
    """softmax of a over the visible keys (hidden ones -inf)."""
    return torch.softmax(a if hidden is None else a.masked_fill(hidden, -math.inf), -1)


def _cog_weights(s: torch.Tensor, hidden, signed: bool = True, use_abs: bool = True
                 ) -> torch.Tensor:
    w = _visible_softmax(s.abs() if use_abs else s, hidden)
    return torch.sign(s) * w if signed else w


def _gated(out: torch.Tensor, gate) -> torch.Tensor:
    return out if gate is None else out * gate


def _cog_sign_dropped(q, k, v, *, scale, causal, gate=None):
    return _gated(_family(q, k, v, scale, causal, lambda s, hidden: _cog_weights(
        s, hidden, signed=False)), gate)


def _cog_no_abs(q, k, v, *, scale, causal, gate=None):
    return _gated(_family(q, k, v, scale, causal, lambda s, hidden: _cog_weights(
        s, hidden, use_abs=False)), gate)


def _cog_gate_before_normalization(q, k, v, *, scale, causal, gate=None):
    """sum_j sign(s_j) e_j v_j g / sum_j e_j g: the gate inside the normalization cancels."""
    wd = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q.to(wd) @ k.to(wd).transpose(-1, -2)) * scale
    hidden = ~visible(s.shape[-2], s.shape[-1], s.device) if causal else None
    a = s.abs() if hidden is None else s.abs().masked_fill(hidden, -math.inf)
    e = torch.exp(a - a.amax(-1, keepdim=True))
    g = torch.ones((*s.shape[:-1], v.shape[-1]), dtype=wd) if gate is None else gate.to(wd)
    num = (torch.sign(s) * e) @ v.to(wd) * g
    den = e.sum(-1, keepdim=True) * g
    return (num / den).to(q.dtype)


ATTENTION_MUTANTS += (
    Mutant(KernelSpec("attention_cog_sign_dropped", "cog_attention", "torch",
                      _cog_sign_dropped, source="selftest"),
           "cog attention: the sign dropped, softmax(|s|)"),
    Mutant(KernelSpec("attention_cog_no_abs", "cog_attention", "torch", _cog_no_abs,
                      source="selftest"),
           "cog attention: |s| replaced by s, sign(s) softmax(s)"),
    Mutant(KernelSpec("attention_cog_gate_before_normalization", "cog_attention", "torch",
                      _cog_gate_before_normalization, source="selftest"),
           "cog attention: the gate applied before normalization (it cancels: out ungated)"),
)


def run_attention_selftest(
    mutants: tuple[Mutant, ...],
    correct: list[KernelSpec],
    matrix: AttentionMatrix,
    cache_dir: Path | None,
    on_outcome: Callable[[SelftestOutcome], None] = lambda o: None,
) -> list[SelftestOutcome]:
    """run_selftest for attention kernels, on an attention matrix (each case's truth once)."""
    plan = [(m.spec, m.bug, True) for m in mutants] + [(k, "", False) for k in correct]
    records: dict[int, list[VerifyRecord]] = {i: [] for i in range(len(plan))}
    for mode in ("fwd", "bwd"):
        mine = [i for i, (spec, _, _) in enumerate(plan) if spec.mode == mode]
        functions = sorted({plan[i][0].function for i in mine})
        for case in expand_attention(matrix, functions):
            prep = None
            for i in mine:
                spec = plan[i][0]
                if not given(spec, case):
                    continue
                prep = prep or prepare(case, mode, cache_dir, DEFAULT_PRECISION)
                records[i].append(verify_attention_one(spec, prep))
    outcomes = []
    for i, (spec, bug, expect_fail) in enumerate(plan):
        failed = [r for r in records[i] if r.failed]
        o = SelftestOutcome(spec.name if spec.mode == "fwd" else f"{spec.name} (bwd)", bug,
                            expect_fail, len(failed), len(records[i]),
                            failed[0] if failed else None)
        on_outcome(o)
        outcomes.append(o)
    return outcomes
