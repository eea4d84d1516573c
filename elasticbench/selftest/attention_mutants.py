"""Deliberately wrong attention kernels, one bug of docs/attention.md each.

Each is the eager composite with one change (torch, forward, the attention contract), so
catching it shows the attention verification sees that bug and nothing else:

- the offset not rescaled: den = l + beta instead of l + beta exp(-m/tau) (the bug
  docs/definitions.md section 1 describes for rows, inside attention);
- the mask applied after the shift: kept where s - m >= 0, which keeps only the maxima;
- a query that keeps no key divided 0 / 0: NaN where the policy says exactly 0.
"""

from __future__ import annotations

import math

import torch

from ..attention.layout import visible
from ..registry import KernelSpec
from .mutants import Mutant


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

# the correct form of the mutants' code: it must pass where they fail
ATTENTION_CONTROL = _spec("attention_mutant_control")
