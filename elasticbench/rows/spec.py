"""What a row of the exp family computes (`ExpSpec`), the contract of its implementations,
and the three members' specs.

Every implementation of the rows (elasticbench.dispatch.Implementation) keeps one contract,
on rows-last tensors:

    accepts(x, spec) -> bool
    forward(x, spec) -> y
    backward(x, y, g, spec, params) -> (dx, dtau, doffset)

dtau and doffset are per-row (..., 1) contributions, or their total (shape (1,)) where the
implementation sums them itself (scalar tau and offset only); None unless `params`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .param_layout import Scalar


@dataclass(frozen=True, eq=False)
class ExpSpec:
    """What a row computes (kernels/cpp/table.h's eb::ExpSpec): exp((s - m)/tau) over kept s,
    m = max(max kept, floor), over their sum plus offset exp(-m/tau) (None: no offset).
    Kept: x >= 0 with mask_negative (elastic), else x > -inf. tau and offset as laid out by
    rows.param_layout.as_rows: floats, 0-d tensors or per-row (..., 1) tensors."""

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
