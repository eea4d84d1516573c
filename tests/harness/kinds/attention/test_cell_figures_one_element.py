"""Issue 57 item 6: a verification cell's figures describe one element, and an error
against an exact zero is given absolutely (its ulps, in units of the smallest subnormal,
mean nothing), in the records and in the table."""

from __future__ import annotations

import numpy as np

from elasticbench.harness.kinds.attention.scoring import score, verdict
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.report.verify_table import _cell_entry, summarize


def _fp64_output_with_an_exact_zero():
    """Two elements of an fp64 output: exact 0 (an error of 1e-17 against an absolute
    allowance of 1e-16, 10% of it) and exact 1 (1 ulp against 2.2e-15, 5% of it)."""
    hi = np.array([[0.0, 1.0]])
    got = np.array([[1e-17, 1.0 + 2.0 ** -52]])
    allowed_abs = np.array([[1e-16, 2.0 ** -52 * 20]])
    return score("out", got, hi, np.zeros_like(hi), np.zeros_like(hi, dtype=bool),
                 np.zeros_like(hi, dtype=bool), allowed_abs, get_format("fp64"))


def test_an_error_against_an_exact_zero_is_absolute_in_the_record():
    result = verdict([_fp64_output_with_an_exact_zero()])
    assert result.passed
    assert abs(result.max_budget_frac - 0.1) < 1e-9
    # before: max_ulp was ~2e307 (1e-17 in units of 4.9e-324) from the zero element
    assert abs(result.max_ulp - 1.0) < 1e-9  # the other element's, where ulps mean something
    w = result.worst
    assert w["expected"] == 0.0 and w["ulp"] is None and w["allowed_ulp"] is None
    assert w["abs_err"] == 1e-17 and w["allowed_abs"] == 1e-16


def test_an_accuracy_failure_against_an_exact_zero_reads_absolute():
    s = _fp64_output_with_an_exact_zero()
    s.got[0, 0] = 3e-16
    s.frac[0, 0] = 3.0
    result = verdict([s])
    assert not result.passed
    assert result.reason == ("accuracy: out |error| 3e-16 against an exact 0 > budget 1e-16 "
                             "(absolute)")


def _record(ulp: float, frac: float, worst: dict) -> VerifyRecord:
    return VerifyRecord(kernel="k", function="elastic_attention", backend="numpy",
                        dtype="fp64", input="normal", seed=0, shape=(1, 1, 2, 2, 2),
                        params={}, passed=True, max_ulp=ulp, max_budget_frac=frac,
                        special_ok=True, worst=worst, mode="bwd")


def test_a_passing_cell_shows_the_error_and_share_of_one_element():
    # record A: its largest share (40%) at an element of 2 ulps, its largest ulps (2e307)
    # at an exact 0; record B: 3 ulps, 10%. Before: "2e+307 (40%)", two elements mixed.
    a = _record(2e307, 0.4, {"ulp": 2.0, "allowed_ulp": 5.0, "abs_err": 4e-16,
                             "allowed_abs": 1e-15})
    b = _record(3.0, 0.1, {"ulp": 3.0, "allowed_ulp": 30.0})
    cell = summarize([b, a]).cells["elastic_attention (bwd)"]["k"]["fp64"]
    assert _cell_entry(cell).text == "2 (40%)"
    # the element behind the largest share has an exact 0: its error is given absolutely
    c = _record(1.0, 0.9, {"ulp": None, "allowed_ulp": None, "abs_err": 9e-17,
                           "allowed_abs": 1e-16})
    cell = summarize([a, b, c]).cells["elastic_attention (bwd)"]["k"]["fp64"]
    assert _cell_entry(cell).text == "9e-17 abs (90%)"
