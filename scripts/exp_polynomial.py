"""The native exponential's degree-6 polynomial (kernels/cpp/simd.h, `EXP_POLY6`).

    .venv/bin/python scripts/exp_polynomial.py

p(r) = 1 + r + r^2 q(r), with q of degree 4 interpolating (e^r - 1 - r)/r^2 at its 5
Chebyshev nodes on [-a, a], a = (ln 2)/2 (1 + 2^-8) (the reduced argument's range, with room
for its rounding), in 60-digit arithmetic. The first two coefficients stay exactly 1, so
rounding the others to fp32 costs little (they are multiplied by r^2 <= 0.12); an
unconstrained interpolant of degree 6 is 2^-28.5 in exact coefficients but lost a quarter
of an ulp once its linear coefficient, 1 + 2^-23.4, was rounded to fp32. Prints the
monomial coefficients as C hex-float literals and the polynomial's largest relative error
on 4001 points of the interval, with the coefficients as doubles and as floats: 2^-26.5
both, against 2^-27.0 for the Taylor polynomial of degree 7 it replaced, with one
multiply-add fewer a vector (docs/native.md section 3). tests/library/test_native.py checks that
simd.h holds exactly these coefficients.
"""

from __future__ import annotations

import math
import struct

import mpmath as mp

DEGREE = 6


def coefficients(degree: int = DEGREE) -> tuple[list[float], float, float]:
    """The monomial coefficients (rounded to double) and the polynomial's largest relative
    error against exp on the interval, with its coefficients as doubles and as floats."""
    with mp.workdps(60):
        a = mp.log(2) / 2 * (1 + mp.mpf(2) ** -8)
        k = degree - 2  # q's degree

        def g(t):  # (e^t - 1 - t)/t^2 by its series: no cancellation near 0
            return mp.nsum(lambda i: t**i / mp.factorial(i + 2), [0, mp.inf])

        nodes = [a * mp.cos(mp.pi * (2 * j + 1) / (2 * (k + 1))) for j in range(k + 1)]
        vandermonde = mp.matrix([[t**j for j in range(k + 1)] for t in nodes])
        q = mp.lu_solve(vandermonde, mp.matrix([g(t) for t in nodes]))
        coef = [1.0, 1.0] + [float(c) for c in q]

        def error(cs: list[float]) -> float:
            return float(max(abs(sum(mp.mpf(c) * t**i for i, c in enumerate(cs)) / mp.exp(t) - 1)
                             for t in mp.linspace(-a, a, 4001)))

        as_float = [float(struct.unpack("f", struct.pack("f", c))[0]) for c in coef]
        return coef, error(coef), error(as_float)


def main() -> None:
    coef, err, err_float = coefficients()
    print(f"// degree {DEGREE}, largest relative error 2^{math.log2(err):.2f} "
          f"(2^{math.log2(err_float):.2f} with fp32 coefficients)")
    print(", ".join(c.hex() for c in coef))


if __name__ == "__main__":
    main()
