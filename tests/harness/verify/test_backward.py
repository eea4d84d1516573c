"""Gradient references (mpmath) against finite differences, and `verify --mode bwd`."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import mpmath
import pytest

from elasticbench.harness.functions import get_function

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _loss(fname: str, row: list, g: list, params: dict) -> mpmath.mpf:
    t = get_function(fname).reference_row(row, **params)
    return mpmath.fsum(mpmath.mpf(gi) * yi for gi, yi in zip(g, t.y, strict=True))


def _fd(f) -> mpmath.mpf:
    h = mpmath.mpf(10) ** -25
    # central difference at 256 bits: truncation ~h^2 = 1e-50, rounding ~2^-256/h = 1e-52
    return (f(h) - f(-h)) / (2 * h)


@pytest.mark.parametrize(("fname", "params"), [
    ("elastic", {"tau": 0.7, "beta": 1.5}),
    ("elastic", {"tau": 0.01, "beta": 100.0}),
    ("elastic", {"tau": 3.0, "beta": 0.0}),
    ("softmax", {}),
    ("softmax1", {}),
])
def test_gradient_reference_matches_finite_differences(fname, params):
    row = [0.5, -1.25, 0.03125, 2.0, -0.75, 1.0]
    g = [1.0, -2.0, 0.5, 0.25, 3.0, -1.5]
    fn = get_function(fname)
    with mpmath.workprec(256):
        grad = fn.gradient_row(row, g, **params)
        for k, v in enumerate(row):
            def shifted(h, k=k, v=v):
                # row values are float64; evaluate with an mpf in position k
                r = list(row)
                r[k] = mpmath.mpf(v) + h
                return _loss(fname, r, g, params)
            if fname == "elastic" and v < 0:
                assert grad.dx[k] == 0 and grad.zero[k]
                continue
            fd = _fd(shifted)
            assert abs(grad.dx[k] - fd) <= mpmath.mpf(10) ** -45 * (1 + abs(fd))
        for name in fn.param_names:
            def moved(h, name=name):
                return _loss(fname, row, g, {**params, name: mpmath.mpf(params[name]) + h})
            fd = _fd(moved)
            assert abs(grad.dparams[name] - fd) <= mpmath.mpf(10) ** -45 * (1 + abs(fd))


def test_gradient_reference_special_rows():
    el = get_function("elastic")
    g = [1.0, 2.0, 3.0]
    nan = el.gradient_row([1.0, math.nan, 0.0], g, tau=1.0, beta=1.0)
    assert nan.dx == [None] * 3 and nan.dparams == {"tau": None, "beta": None}
    masked = el.gradient_row([-1.0, -math.inf, -2.0], g, tau=1.0, beta=0.0)
    assert all(d == 0 for d in masked.dx) and all(masked.zero)
    assert masked.dparams == {"tau": 0, "beta": 0}
    inf = el.gradient_row([math.inf, 1.0, -1.0], g, tau=1.0, beta=1.0)
    assert all(d == 0 for d in inf.dx) and inf.dparams == {"tau": 0, "beta": 0}
    assert get_function("stablemax").gradient_row is None


def test_each_function_says_what_its_backward_budget_needs():
    import numpy as np

    from elasticbench.harness.functions import FUNCTIONS
    from elasticbench.harness.verify.backward import BOUNDS

    for f in FUNCTIONS.values():
        if f.gradient_row is not None:  # every parameter's gradient has a bound
            assert all(p.role in BOUNDS for p in f.params), f.name
    el, s1 = get_function("elastic"), get_function("softmax1")
    row = np.array([-1.0, -0.0, 0.0, 2.0, -math.inf])
    assert el.kept(row).tolist() == [False, True, True, True, False]
    assert get_function("softmax").kept(row).tolist() == [True] * 4 + [False]
    assert (el.temperature({"tau": 0.5, "beta": 2.0}), el.offset({"tau": 0.5, "beta": 2.0})) \
        == (0.5, 2.0)
    assert (s1.temperature({}), s1.offset({}), s1.shift_floor) == (1.0, 1.0, 0.0)
    assert get_function("softmax").offset({}) == 0.0


def test_gradient_truth_is_cached_apart_from_the_forward(tmp_path):
    import numpy as np

    from elasticbench.harness.numerics.truth.cache import TruthJob, TruthStore, solve
    from elasticbench.harness.numerics.truth.row_truth import GradTruth

    x = np.array([[0.5, -1.0, 2.0], [1.0, 0.0, -3.0]])
    g = np.array([[1.0, 2.0, -1.0], [0.5, 0.5, 0.5]])
    params = (("tau", 1.0), ("beta", 1.0))
    fwd = TruthJob("elastic", params, "fp64", x, np.arange(2), 128)
    bwd = TruthJob("elastic", params, "fp64", x, np.arange(2), 128, g)
    assert fwd.key() != bwd.key()
    store = TruthStore(tmp_path)
    first = solve([bwd], store)[0]
    again = solve([bwd], store)[0]  # from disk
    assert isinstance(again, GradTruth)
    np.testing.assert_array_equal(first.dx_hi, again.dx_hi)
    np.testing.assert_array_equal(first.dp_hi, again.dp_hi)
    assert first.dzero[0].tolist() == [False, True, False]


# --- the CLI ------------------------------------------------------------------------------


def test_verify_bwd_quick_passes_for_builtins(cli, tmp_path):
    out = tmp_path / "b.json"
    r = cli("verify", "--quick", "--mode", "bwd", "-d", "fp32,bf16", "--json", str(out))
    assert r.code == 0, r.out + r.err
    assert "elastic (bwd)" in r.out and "0 failed" in r.out
    recs = json.loads(out.read_text())["records"]
    assert {r["mode"] for r in recs} == {"bwd"}
    assert {r["kernel"] for r in recs} >= {"torch_elastic_bwd", "numpy_elastic_bwd",
                                           "torch_safe_softmax_bwd", "numpy_softmax1_bwd"}
    el = [r for r in recs if r["function"] == "elastic" and r["dparams"]["tau"]["expected"] != "nan"]
    assert el and all(r["dparams"]["tau"]["rel_err"] <= r["dparams"]["tau"]["allowed_rel"]
                      for r in el)
    for key in ("kernel", "function", "dtype", "max_ulp", "max_budget_frac", "passed", "worst"):
        assert key in recs[0]


def test_verify_both_records_both_modes(cli, tmp_path):
    out = tmp_path / "both.json"
    r = cli("verify", "--quick", "--mode", "both", "-f", "softmax1", "-d", "fp16",
            "--input", "normal,specials", "--json", str(out))
    assert r.code == 0, r.out + r.err
    modes = {(x["kernel"], x["mode"]) for x in json.loads(out.read_text())["records"]}
    assert ("torch_softmax1", "fwd") in modes and ("torch_softmax1_bwd", "bwd") in modes


def test_wrong_backward_kernels_are_flagged(cli):
    r = cli("verify", "--quick", "--mode", "bwd", "--kernel-file",
            str(EXAMPLES / "wrong_backward.py"), "-d", "fp32,fp64")
    assert r.code == 1, r.out + r.err
    text = " ".join(r.out.split())
    assert "FAIL elastic_bwd_no_rescale" in text and "dbeta relative error" in text
    assert "FAIL elastic_bwd_no_mask" in text and "masked position" in text


def test_a_1e4_relative_error_in_dx_fails_fp32(cli, tmp_path):
    p = tmp_path / "sloppy.py"
    p.write_text(textwrap.dedent("""
        from elasticbench import register_kernel
        from elasticbench.harness.builtin.torch_kernels import torch_safe_softmax_bwd

        @register_kernel(function="softmax", backend="torch", name="sloppy_bwd", mode="bwd")
        def sloppy_bwd(x, y, g):
            return torch_safe_softmax_bwd(x, y, g) * (1 + 1e-4)
    """))
    r = cli("verify", "--quick", "--mode", "bwd", "--kernel-file", str(p), "-d", "fp32",
            "--input", "normal")
    assert r.code == 1 and "accuracy: dx" in " ".join(r.out.split())


def test_bad_mode_and_gradientless_function_exit_2(cli):
    r = cli("verify", "--quick", "--mode", "sideways")
    assert r.code == 2 and "unknown --mode 'sideways'" in r.err
    r = cli("verify", "--quick", "--mode", "bwd", "-f", "stablemax")
    assert r.code == 2 and r.err.count("\n") == 1
