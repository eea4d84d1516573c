"""The domains of the family's scalar parameters, and the check a number given for one passes.

This is the library's own (elasticbench.functional and elasticbench.nn check their float
arguments here); it imports nothing but the standard library, so the harness's exact
definitions (elasticbench.harness.functions) can state their parameters' ranges from it without the
library importing them (docs/dispatch.md section 1).

    tau   temperature of Elastic-Softmax     finite and > 0
    beta  its denominator offset             finite and >= 0
    eta   symax's denominator offset         finite and >= 0
    bias  sigmoid's shift                    finite, either sign
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Domain:
    """A parameter's allowed values: finite, and > lower (strict) or >= lower; a lower of
    -inf allows every finite value."""

    name: str
    lower: float
    strict: bool

    def contains(self, v: float) -> bool:
        """Whether the float v is in the domain (NaN and infinities never are)."""
        return math.isfinite(v) and (v > self.lower if self.strict else v >= self.lower)

    def describe(self) -> str:
        """The domain in words, as the error messages say it: 'finite and > 0'."""
        if self.lower == -math.inf:
            return "finite"
        return f"finite and {'>' if self.strict else '>='} {self.lower:g}"

    def check(self, value: object) -> float:
        """value as a float; ValueError in one line, naming the parameter, when it is not a
        number or not in the domain."""
        try:
            v = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{self.name} must be a number, got {value!r}") from None
        if not self.contains(v):
            raise ValueError(f"{self.name} must be {self.describe()}, got {value!r}")
        return v


TAU = Domain("tau", 0.0, strict=True)
BETA = Domain("beta", 0.0, strict=False)
ETA = Domain("eta", 0.0, strict=False)
BIAS = Domain("bias", -math.inf, strict=False)

DOMAINS = {d.name: d for d in (TAU, BETA, ETA, BIAS)}
