"""The implementations of the exp family's rows (tiers) and the choice of one per call.

Every tier keeps one contract, on rows-last tensors:

    forward(x, spec) -> y
    backward(x, y, g, spec, params) -> (dx, dtau, doffset)

dtau and doffset are per-row (..., 1) contributions (or their total, shape (1,), where the
tier sums them itself; only for scalar tau and offset), None unless `params`. A tier adds
itself with `register_tier` when its module is imported; `choose` imports the modules of
TIER_MODULES once and returns the first registered tier that accepts the call, else the
torch code, which takes everything. The autograd function keeps the chosen tier for its
backward (elasticbench.functional).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .exp_normalize import exp_normalize_backward, exp_normalize_forward
from .layout import Scalar

# Imported on the first choice: the native C++ kernels (CPU), the Triton kernels (CUDA).
TIER_MODULES = ("elasticbench.rows.cpp", "elasticbench.kernels.triton.tier")


@dataclass(frozen=True, eq=False)
class ExpSpec:
    """What a row computes (kernels/cpp/table.h's eb::ExpSpec): exp((s - m)/tau) over kept s,
    m = max(max kept, floor), over their sum plus offset exp(-m/tau) (None: no offset).
    Kept: x >= 0 with mask_negative (elastic), else x > -inf. tau and offset as laid out by
    rows.layout.as_rows: floats, 0-d tensors or per-row (..., 1) tensors."""

    mask_negative: bool
    floor: float = -math.inf
    tau: Scalar = 1.0
    offset: Scalar | None = None

    def keep(self, x: torch.Tensor) -> torch.Tensor:
        return x >= 0 if self.mask_negative else x > -math.inf

    def scalar(self) -> bool:
        """Whether tau and offset are one value for every row (floats or 0-d tensors)."""
        return all(not isinstance(v, torch.Tensor) or v.ndim == 0 for v in (self.tau, self.offset))


ELASTIC = ExpSpec(mask_negative=True)  # tau and beta (the offset) come with each call
SOFTMAX = ExpSpec(mask_negative=False)
SOFTMAX1 = ExpSpec(mask_negative=False, floor=0.0, offset=1.0)

Backward = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


@dataclass(frozen=True)
class Tier:
    """One implementation of the contract above; accepts(x, spec) says whether it takes x."""

    name: str
    accepts: Callable[[torch.Tensor, ExpSpec], bool]
    forward: Callable[[torch.Tensor, ExpSpec], torch.Tensor]
    backward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ExpSpec, bool], Backward]


def _torch_forward(x: torch.Tensor, spec: ExpSpec) -> torch.Tensor:
    return exp_normalize_forward(x, spec.keep(x), spec.tau, spec.offset, spec.floor)


def _torch_backward(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, spec: ExpSpec,
                    params: bool) -> Backward:
    return exp_normalize_backward(x, y, g, spec.keep(x), spec.tau, spec.offset, spec.floor,
                                  params)


TORCH = Tier("torch", lambda x, spec: True, _torch_forward, _torch_backward)
_registered: dict[str, Tier] = {}


def register_tier(tier: Tier) -> Tier:
    """Offer `tier` to `choose`, ahead of the torch code; a second tier of a name replaces it."""
    _registered[tier.name] = tier
    return tier


@functools.lru_cache(maxsize=1)
def _import_tier_modules() -> None:
    for module in TIER_MODULES:
        with contextlib.suppress(ImportError):  # a plug-in not installed: the others serve
            importlib.import_module(module)


def tiers() -> tuple[Tier, ...]:
    """The tiers in order of preference; the torch one always comes last."""
    _import_tier_modules()
    return (*_registered.values(), TORCH)


def choose(x: torch.Tensor, spec: ExpSpec) -> Tier:
    """The tier that computes spec on x (both directions: the backward uses it too)."""
    return next(t for t in tiers() if t.accepts(x, spec))
