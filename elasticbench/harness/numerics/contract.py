"""Accuracy contracts: which error analysis a kernel's budgets come from, and a run's scale.

A kernel states the arithmetic it is meant to do (`register_kernel(..., accuracy=...)`):

- `wide` (the default): a 16-bit kernel computes in fp32 and rounds once to its format, as
  the budgets of docs/numerics.md section 3 assume; fp32 and fp64 kernels compute in their
  own format.
- `own`: every step (the shift, the division by tau, the exponential, the sum, the division)
  rounds to the kernel's own format, fp16 and bf16 included: the same error analysis with
  that format's unit roundoff in every step (docs/numerics.md section 3.1). An attention
  kernel under `own` rounds its scores, weights and weighted sum (and in the backward every
  product and sum) to its format: the attention budgets with that format's unit roundoff
  as u_w (numerics/budgets/attention_own.py, docs/numerics.md section 9).

For fp32 and fp64 the two contracts are one: those kernels compute in their own format.

`verify --budget-scale X` multiplies every budget of a run by X (X > 0). Each record says
which contract and scale judged it (`accuracy`, `budget_scale`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WIDE = "wide"
OWN = "own"
CONTRACTS: dict[str, str] = {
    WIDE: "a 16-bit kernel computes wider (fp32) and rounds once to its format",
    OWN: "every step rounds to the kernel's own format (16-bit arithmetic throughout)",
}


def check_accuracy(name: str) -> str:
    """The contract's name if it is one; ValueError naming the choices otherwise."""
    if name not in CONTRACTS:
        raise ValueError(f"unknown accuracy contract {name!r} (choose from "
                         f"{', '.join(CONTRACTS)})")
    return name


def check_scale(value: float) -> float:
    """A budget scale: a finite number > 0; ValueError otherwise."""
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"--budget-scale must be a finite number > 0, got {value!r}")
    return float(value)


def parse_scale(text: str) -> float:
    """--budget-scale's text as a scale (ValueError with one line when it is not one)."""
    try:
        return check_scale(float(text))
    except ValueError:
        raise ValueError(f"--budget-scale must be a finite number > 0, got {text!r}") from None


@dataclass(frozen=True)
class Judging:
    """How a case is judged: the kernel's contract and the run's budget scale."""

    accuracy: str = WIDE
    scale: float = 1.0

    def describe(self) -> str:
        """'wide', 'own', or with a scale other than 1 'own x4'."""
        return self.accuracy if self.scale == 1 else f"{self.accuracy} x{self.scale:g}"
