"""Boundary and layout coverage: inputs laid out as models lay them out, column and row counts
at the powers of two, parameters drawn over their span, explicit inputs in case files, and an
exact reference that costs per distinct value."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from elasticbench.harness.execute import call_kernel
from elasticbench.harness.inputs import generate
from elasticbench.harness.inputs.explicit import Explicit
from elasticbench.harness.inputs.layouts import LAYOUTS, place
from elasticbench.harness.numerics.truth.row_truth import evaluate_rows
from elasticbench.harness.registry import KernelSpec, get_kernel
from elasticbench.harness.verify.matrix import builtin_case, expand, load_matrix
from elasticbench.harness.verify.tables import CaseFileError
from elasticbench.harness.verify.verifier import rows_to_check

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_holds_the_same_values_with_canaries_around(layout):
    x = generate("normal", "fp32", (3, 7), 1)
    p = place(x, layout)
    assert np.array_equal(p.view(), x)
    outside = p.buffer[~p.inside()]
    assert np.isnan(outside).all()
    if layout == "packed":
        assert p.buffer.size == x.size and p.view().flags.c_contiguous
    elif layout == "transposed":
        assert p.strides == (1, 3)
    else:
        assert outside.size > 0  # padding or the elements before the offset


def _packed_reader(x):
    """Reads its input's memory as if it were packed: the bug a padded input shows."""
    flat = np.lib.stride_tricks.as_strided(x, (x.size,), (x.itemsize,))
    rows = flat.reshape(x.shape).astype(np.float64)
    e = np.exp(rows - rows.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


def _pad_writer(x):
    """Uses the row padding after its input as scratch space."""
    y = get_kernel("numpy_softmax").fn(x)
    if x.strides[0] > x.shape[1] * x.itemsize:
        np.lib.stride_tricks.as_strided(x[:, -1:], (x.shape[0], 2), (x.strides[0], x.itemsize))[:, 1] = 0
    return y


def test_a_kernel_that_assumes_packed_rows_fails_only_on_other_layouts():
    spec = KernelSpec("packed_reader", "softmax", "numpy", _packed_reader)
    x = generate("normal", "fp32", (4, 9), 3)
    want = get_kernel("numpy_softmax").fn(x)
    assert np.allclose(call_kernel(spec, x, {}, "packed").output, want)
    for layout in ("padded", "transposed"):
        got = call_kernel(spec, x, {}, layout).output
        assert not np.allclose(got, want, equal_nan=False), layout
    assert np.allclose(call_kernel(spec, x, {}, "offset").output, want)


def test_a_kernel_that_reads_its_storage_from_the_start_fails_on_an_offset():
    torch = pytest.importorskip("torch")

    def from_storage(x):
        whole = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
        return torch.softmax(whole[: x.numel()].reshape(x.shape), dim=-1)

    spec = KernelSpec("from_storage", "softmax", "torch", from_storage)
    x = generate("normal", "fp32", (4, 9), 3)
    want = get_kernel("numpy_softmax").fn(x)
    assert np.allclose(call_kernel(spec, x, {}, "packed").output, want)
    assert np.isnan(call_kernel(spec, x, {}, "offset").output).any()


def test_writing_into_the_padding_is_a_contract_violation():
    spec = KernelSpec("pad_writer", "softmax", "numpy", _pad_writer)
    x = generate("normal", "fp32", (4, 9), 3)
    out = call_kernel(spec, x, {}, "padded")
    assert out.wrote_outside and not out.modified_input
    assert not call_kernel(spec, x, {}, "packed").wrote_outside


@pytest.mark.parametrize(("backend", "dtype"), [("torch", "fp32"), ("cpp", "bf16")])
def test_torch_kernels_get_strided_views_and_triton_no_transposed_rows(backend, dtype):
    torch = pytest.importorskip("torch")
    seen = {}

    def probe(x):
        seen["strides"], seen["offset"] = x.stride(), x.storage_offset()
        return torch.softmax(x, dim=-1)

    spec = KernelSpec("probe", "softmax", backend, probe)  # cpp kernels also get CPU tensors
    x = generate("normal", dtype, (3, 5), 2)
    assert call_kernel(spec, x, {}, "padded").output is not None
    assert seen["strides"] == (8, 1)
    call_kernel(spec, x, {}, "offset")
    assert seen["offset"] == 5
    call_kernel(spec, x, {}, "transposed")
    assert seen["strides"] == (1, 3)
    assert not KernelSpec("t", "softmax", "triton", probe).takes_layout("transposed")
    assert KernelSpec("t", "softmax", "triton", probe).takes_layout("padded")


def test_rows_past_the_sample_keep_the_first_last_and_power_of_two_edges():
    rows = rows_to_check((4097, 5), max_elements=1 << 20, seed=1, max_rows=64)
    assert len(rows) == 64 and len(set(rows)) == 64
    for r in (0, 4096, 4095, 2047, 2048, 1023, 1024, 511, 512):
        assert r in rows
    assert rows_to_check((10, 5), 1000, 1, 64).tolist() == list(range(10))


def test_a_sample_keeps_the_rows_that_hold_special_and_extreme_values():
    x = np.random.default_rng(0).normal(size=(4097, 5)).astype(np.float32)
    x[3001, 2], x[3002, 0], x[3003, 4], x[2999, 1] = np.nan, np.inf, -np.inf, 1e30
    x[3000, 3] = -1e30
    rows = rows_to_check(x.shape, max_elements=1 << 20, seed=1, max_rows=64, x=x)
    assert len(rows) == 64 and {2999, 3000, 3001, 3002, 3003} <= set(rows.tolist())
    plain = rows_to_check(x.shape, max_elements=1 << 20, seed=1, max_rows=64)
    assert not {2999, 3000, 3001, 3002, 3003} <= set(plain.tolist())  # not kept by luck


def _case(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "m.toml"
    p.write_text("[verify]\nseed = 3\ndtypes = ['fp32']\n" + textwrap.dedent(body))
    return p


def test_columns_layouts_and_draws_expand(tmp_path):
    m = load_matrix(_case(tmp_path, """
        draws = 2
        [[verify.inputs]]
        generator = "coarse"
        rows = 2
        columns = { powers_of_two = [3, 5], around = [-1, 1] }
        layouts = ["packed", "padded"]
        params.elastic = { tau = [1], beta = [1] }
        """))
    cases = expand(m, ["elastic"])
    assert sorted({c.shape for c in cases}) == [(2, 7), (2, 9), (2, 15), (2, 17), (2, 31), (2, 33)]
    assert {c.layout for c in cases} == {"packed", "padded"}
    per_case = [c for c in cases if c.shape == (2, 9) and c.layout == "packed"]
    assert len(per_case) == 3  # the grid point and two drawn sets
    drawn = [c.param_dict for c in per_case if c.param_dict != {"tau": 1.0, "beta": 1.0}]
    assert all(1e-3 <= d["tau"] <= 1e3 and 1e-12 <= d["beta"] <= 1e6 for d in drawn)
    assert expand(m, ["elastic"]) == cases  # seeded: the same draws every time
    assert len(expand(m, ["softmax"])) == 12  # nothing to draw


def test_draws_cover_the_span_log_uniformly(tmp_path):
    m = load_matrix(_case(tmp_path, """
        draws = 400
        [[verify.inputs]]
        generator = "normal"
        shapes = [[1, 4]]
        """))
    taus = np.array([c.param_dict["tau"] for c in expand(m, ["elastic"])][12:])
    assert len(taus) == 400
    share = np.mean((taus > 2) & (taus < 8))  # log(4)/log(1e6) = 0.10 of the span
    assert 0.05 < share < 0.16
    assert taus.min() < 0.01 and taus.max() > 100


@pytest.mark.parametrize(("body", "message"), [
    ("[[verify.inputs]]\ngenerator = 'normal'\nshapes = [[1, 2]]\nlayouts = ['diagonal']\n",
     "unknown layout 'diagonal'"),
    ("[[verify.inputs]]\ngenerator = 'normal'\ncolumns = { powers_of_two = [3, 40] }\n",
     "powers_of_two"),
    ("[[verify.inputs]]\ngenerator = 'normal'\nshapes = [[1, 2]]\ndraws = -1\n", "draws"),
    ("[[verify.inputs]]\nname = 'x'\nvalues = [[1.0, 2.0], [3.0]]\n", "equal length"),
    ("[[verify.inputs]]\nname = 'x'\nshape = [1, 2]\nset = [[0, 5, 1.0]]\n", "outside the shape"),
])
def test_bad_coverage_keys_are_named(tmp_path, body, message):
    with pytest.raises(CaseFileError, match=message):
        load_matrix(_case(tmp_path, body))


def test_explicit_inputs_round_trip_through_a_case_file(tmp_path):
    x = np.full((2, 6), 1.5)
    x[1, 4] = np.nan
    x[0, 0] = -0.0
    e = Explicit.of(x)
    assert e.fill == 1.5 and len(e.cells) == 2
    fields = e.toml_fields()
    from elasticbench.harness.inputs.explicit import toml_value

    body = "[[verify.inputs]]\nname = 'mine'\n" + "".join(
        f"{k} = {toml_value(v)}\n" for k, v in fields.items())
    (case,) = expand(load_matrix(_case(tmp_path, body)), ["softmax"])
    got = case.input()
    assert case.generator == "mine" and got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), x.astype(np.float32).view(np.uint32))
    rows = load_matrix(_case(tmp_path, "[[verify.inputs]]\nname = 'r'\nvalues = [[1.0, inf]]\n"))
    assert np.isposinf(expand(rows, ["softmax"])[0].input()[0, 1])


def test_repeated_values_are_evaluated_once_and_weighted_by_their_count():
    import mpmath

    row = [0.5, -1.0, 0.5, 2.0, -0.0, 0.0, 2.0, -1.0, 0.5]
    t = evaluate_rows("elastic", {"tau": 0.5, "beta": 2.0}, np.array([row]), np.arange(1))
    with mpmath.workprec(200):  # the definition, element by element, nothing grouped
        e = [mpmath.exp(mpmath.mpf(v) / 0.5) if v >= 0 else mpmath.mpf(0) for v in row]
        d = mpmath.fsum(e) + 2
        want = [float(v / d) for v in e]
    np.testing.assert_allclose(t.hi[0], want, rtol=1e-15, atol=0)
    assert t.zero[0].tolist() == [v < 0 for v in row]


def test_a_long_row_of_few_values_is_cheap_and_exact():
    import time

    x = generate("coarse", "fp32", (1, 1 << 20), 5).astype(np.float64)
    start = time.perf_counter()
    t = evaluate_rows("softmax", {}, x, np.arange(1))
    assert time.perf_counter() - start < 5
    assert abs(np.sum(t.hi[0]) - 1) < 1e-12


def test_default_matrix_meets_the_boundaries():
    m = load_matrix(builtin_case("verify"))
    cases = expand(m, ["elastic"], ["fp32"])
    ns = {c.shape[1] for c in cases}
    rows = {c.shape[0] for c in cases}
    assert {65535, 65537, 1 << 22, 255, 257, 4095, 4097} <= ns
    assert any(r > 512 for r in rows) and any(r > 1024 for r in rows)
    assert any(r > 4096 for r in rows)
    assert {"padded", "offset", "transposed"} <= {c.layout for c in cases}
    grid = {(0.01, 0.0), (1.0, 1.0), (10.0, 100.0)}
    assert any((c.param_dict["tau"], c.param_dict["beta"]) not in grid
               and c.param_dict["tau"] not in (0.01, 1.0, 10.0, 0.001, 1000.0) for c in cases)


def test_verify_records_the_layout_and_checks_padded_inputs(cli, tmp_path):
    case = _case(tmp_path, """
        [[verify.inputs]]
        generator = "normal"
        shapes = [[3, 20]]
        layouts = ["packed", "padded", "transposed"]
        """)
    out = tmp_path / "r.json"
    r = cli("verify", "--case", str(case), "--only", "numpy_softmax,torch_safe_softmax",
            "--json", str(out))
    assert r.code == 0, r.out + r.err
    recs = json.loads(out.read_text())["records"]
    assert {(x["kernel"], x["layout"]) for x in recs} >= {("numpy_softmax", "padded"),
                                                         ("torch_safe_softmax", "transposed")}


def test_telling_rows_are_the_first_and_last_holding_each_special_and_extreme():
    """telling_rows names, per kind (NaN, +inf, -inf, the largest and the smallest finite
    value), the first and the last row holding it, on rows mixing all of them."""
    import numpy as np

    from elasticbench.harness.verify.verifier import telling_rows

    x = np.zeros((10, 4))
    x[2, 1] = x[5, 0] = np.nan
    x[3, 3] = np.inf
    x[1, 2] = x[8, 1] = -np.inf
    x[4, 0] = x[6, 2] = 7.0  # largest finite
    x[0, 3] = -9.0  # smallest finite
    x[9] = np.nan  # a row of NaN only
    assert telling_rows(x) == [2, 9, 3, 3, 1, 8, 4, 6, 0, 0]
    assert telling_rows(np.full((3, 2), np.nan)) == [0, 2]  # nothing finite
    assert telling_rows(np.array([[1.0, -0.0], [0.0, 1.0]])) == [0, 1, 0, 1]
