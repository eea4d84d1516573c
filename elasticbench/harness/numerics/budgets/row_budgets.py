"""Per-element error budgets in ulps: what a kernel computing in its own precision can meet.

For an output y_i = exp(z_i) / D, a kernel that works in precision u (the output format's)
makes three kinds of error (docs/numerics.md derives them):

- rounding the exponent argument z_i = (x_i - m)/tau costs one |z_i| u per rounding, after
  exp: a subtraction and a division make two, and a range reduction that splits the shift
  in two (Cody-Waite, as the Two-Pass algorithm does) makes three, so up to 3|z_i| ulps;
- the denominator D is a sum of terms each carrying its own |z_j| u: together the
  output-weighted mean zbar = sum_j e_j |z_j| / D (the rescaled offset included);
- summing n terms: about log2(n) u for blocked/pairwise summation as NumPy and torch do it,
  plus a few roundings for the exp, the division and the final cast.

So the allowance is  a + b |z_i| + c zbar + d log2(n)  ulps of the output format.
Under the default contract (numerics/contract.py) low-precision formats (fp16, bf16) are
expected to accumulate in fp32, which makes the summation term vanish in their ulps; the exp
may still be rounded in the low format. Under the `own` contract every step rounds to the
16-bit format, so its budget is the fp32 one with the 16-bit unit roundoff.
A 1e-4 relative error is 839 to 1678 fp32 ulps: far outside every fp32 allowance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from elasticbench.harness.numerics.contract import OWN, WIDE, check_accuracy
from elasticbench.harness.numerics.dtypes import FloatFormat


@dataclass(frozen=True)
class Budget:
    """Coefficients of a + b|z_i| + c*zbar + d*log2(n), in ulps of the output format."""

    a: float
    b: float
    c: float
    d: float

    def allowance(
        self, zabs: np.ndarray, zbar: np.ndarray, n: int, fmt: FloatFormat
    ) -> np.ndarray:
        """Allowed ulps per element for rows with per-element |z| and per-row zbar.

        |z| is capped where exp(-|z|) falls below the format's smallest subnormal: beyond
        that the output is 0 whatever the rounding, and an uncapped allowance would excuse
        any garbage there.
        """
        zcap = np.log(2.0) * (fmt.p - fmt.emin) + 1.0
        z = np.minimum(zabs, zcap)
        zb = np.minimum(zbar, zcap)[:, None]
        return self.a + self.b * z + self.c * zb + self.d * np.log2(max(n, 1))

    def describe(self) -> str:
        return f"{self.a:g} + {self.b:g}|z| + {self.c:g}·zbar + {self.d:g}·log2(n) ulp"

    def scaled(self, scale: float) -> Budget:
        """Every coefficient times scale: the allowance times scale."""
        if scale == 1:
            return self
        return Budget(self.a * scale, self.b * scale, self.c * scale, self.d * scale)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


BUDGETS: dict[str, Budget] = {
    "fp64": Budget(a=4.0, b=3.0, c=1.0, d=1.0),
    "fp32": Budget(a=4.0, b=3.0, c=1.0, d=1.0),
    "fp16": Budget(a=1.0, b=1.0, c=1.0, d=0.0),
    "bf16": Budget(a=1.0, b=1.0, c=1.0, d=0.0),
}


# Every step rounded in the kernel's own format: the analysis that gives fp32 and fp64 their
# row, with the 16-bit unit roundoff (docs/numerics.md section 3.1).
OWN_BUDGETS: dict[str, Budget] = {**BUDGETS, "fp16": BUDGETS["fp32"], "bf16": BUDGETS["fp32"]}


def budget_for(fmt: FloatFormat, accuracy: str = WIDE, scale: float = 1.0) -> Budget:
    """The budget of a kernel in fmt under its accuracy contract, times the run's scale."""
    table = OWN_BUDGETS if check_accuracy(accuracy) == OWN else BUDGETS
    return table[fmt.name].scaled(scale)
