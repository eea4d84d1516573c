"""The api_ kernels (elasticbench/harness/builtin/api_kernels.py): the library as users call it, timed beside the
raw kernel each call runs, and the run table's `overhead` column drawn from their records
(docs/benchmarking.md section 7)."""

from __future__ import annotations

import json

import pytest
import torch

from elasticbench import devices, settings
from elasticbench.harness.bench.models import wrapped_kernel
from elasticbench.harness.kernel_spec import KernelSpec
from elasticbench.harness.records import QuickVerdict, RunRecord, TimingRecord
from elasticbench.harness.registry import get_kernel
from elasticbench.harness.report.run_table import overheads, run_sheets

NATIVE = devices.native_unavailable() is None  # the native tier builds here
# What an API call runs on the torch backend's device (the CPU in the tests)
RAW = {("elastic", "fwd"): "cpp_elastic" if NATIVE else "torch_elastic",
       ("elastic", "bwd"): "cpp_elastic_bwd" if NATIVE else "torch_elastic_bwd",
       ("elastic_attention", "fwd"): "cpp_attention" if NATIVE else "torch_attention_flash",
       ("elastic_attention", "bwd"): "cpp_attention" if NATIVE else "torch_attention_flash"}
API = {"elastic": "api_elastic", "elastic_attention": "api_attention"}


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    monkeypatch.delenv("ELASTICBENCH_TORCH_DEVICE", raising=False)
    monkeypatch.delenv("ELASTICBENCH_IMPLEMENTATION", raising=False)
    settings.refresh()  # the variable is read once: read it again
    yield
    settings.refresh()  # and forget it: monkeypatch restores the variable after this test


@pytest.mark.parametrize("function,mode", sorted(RAW))
def test_registered_for_both_modes_under_torch_and_naming_the_raw_kernel(function, mode):
    spec = get_kernel(API[function], mode)
    assert (spec.function, spec.backend, spec.mode, spec.source) == (function, "torch", mode,
                                                                     "builtin")
    assert not spec.compiles
    assert wrapped_kernel(spec) == RAW[function, mode]
    assert get_kernel(RAW[function, mode], mode).function == function  # a kernel of its own


def test_the_raw_kernel_follows_a_forced_implementation(monkeypatch):
    monkeypatch.setenv("ELASTICBENCH_IMPLEMENTATION", "torch")
    settings.refresh()  # the variable is read once: read it again
    assert wrapped_kernel(get_kernel("api_elastic", "fwd")) == "torch_elastic"
    assert wrapped_kernel(get_kernel("api_elastic", "bwd")) == "torch_elastic_bwd"
    assert wrapped_kernel(get_kernel("api_attention", "bwd")) == "torch_attention_flash"


def test_any_kernel_may_declare_what_it_wraps():
    def plain(x):
        return x

    def named(x):
        return x

    def resolved(x):
        return x

    named.wraps = "cpp_elastic"  # type: ignore[attr-defined]
    resolved.wraps = lambda: None  # type: ignore[attr-defined]
    specs = [KernelSpec(f.__name__, "elastic", "torch", f) for f in (plain, named, resolved)]
    assert [wrapped_kernel(s) for s in specs] == [None, "cpp_elastic", None]


def test_the_forward_is_the_module_with_learnable_parameters():
    x = torch.randn(3, 40)
    y = get_kernel("api_elastic").fn(x, tau=0.7, beta=0.3)
    assert y.requires_grad and not x.requires_grad  # the parameters carry the graph
    want = get_kernel(RAW["elastic", "fwd"]).fn(x, tau=0.7, beta=0.3)
    torch.testing.assert_close(y.detach(), want)


def test_the_backward_reads_the_given_output_and_gives_dtau_dbeta_themselves():
    torch.manual_seed(0)
    x = torch.randn(4, 33, dtype=torch.float64)
    raw_fwd = get_kernel(RAW["elastic", "fwd"]).fn
    raw_bwd = get_kernel(RAW["elastic", "bwd"], "bwd").fn
    y, g = raw_fwd(x, tau=0.7, beta=0.3), torch.randn(4, 33, dtype=torch.float64)
    api = get_kernel("api_elastic", "bwd").fn
    for _ in range(2):  # the second call reuses the first one's forward graph
        got = api(x, y, g, tau=0.7, beta=0.3)
        for a, b in zip(got, raw_bwd(x, y, g, tau=0.7, beta=0.3), strict=True):
            torch.testing.assert_close(a, b)
    y2 = y * 1.5  # another saved output for the same x: the backward reads it
    torch.testing.assert_close(api(x, y2, g, tau=0.7, beta=0.3)[0],
                               raw_bwd(x, y2, g, tau=0.7, beta=0.3)[0])
    # beta = 0 cannot be learned by the module: still a dbeta
    assert api(x, y, g, tau=0.7, beta=0.0)[2].ndim == 0


# ---------------------------------------------------------------- the overhead column

def _record(kernel: str, median_s: float, *, wraps: str | None = None, dtype: str = "fp32",
            shape: tuple[int, ...] = (8, 1024), params: dict | None = None,
            function: str = "elastic", mode: str = "fwd") -> RunRecord:
    """A measured run record, as a run writes one."""
    attention = len(shape) == 5
    return RunRecord(
        kernel=kernel, function=function, backend="torch", mode=mode, dtype=dtype,
        shape=shape, params=params if params is not None else {"tau": 1.0, "beta": 1.0},
        wraps=wraps, compute_dtype="fp32", cache="in-cache", footprint_bytes=65536,
        rotated_buffers=1, model={"structure": "minimum"}, min_bytes=65536,
        model_bytes=65536.0, timing=TimingRecord(samples_ns=[median_s * 1e9] * 3),
        median_s=median_s, elements_per_s=8192 / median_s, gbps=1.0, pct_copy=10.0,
        roof={"roof_eps": 1e9}, binding="matmul" if attention else "memory", pct_roof=5.0,
        flops=1e6 if attention else None, gflops=1.0 if attention else None,
        pct_matmul=1.0 if attention else None, peak_bytes=0 if attention else None,
        verify=QuickVerdict(status="pass", cases=1, failed=0, max_ulp=0.5))


def _column(sheet, name: str) -> list:
    return [row.get(name) for row in sheet.records()]


def test_overhead_is_the_ratio_of_the_two_medians_in_the_same_cell():
    recs = [
        _record("torch_softmax", 2e-6),
        _record("cpp_elastic", 4e-6),
        _record("api_elastic", 30e-6, wraps="cpp_elastic"),
        _record("cpp_elastic", 1e-3, shape=(256, 4096)),
        _record("api_elastic", 1.2e-3, wraps="cpp_elastic", shape=(256, 4096)),
        _record("cpp_elastic", 5e-6, dtype="bf16"),  # no api_elastic in bf16
        _record("api_elastic", 9e-6, wraps="cpp_elastic", shape=(2, 64)),  # no raw kernel
        _record("api_elastic", 9e-6, wraps="cpp_elastic", params={"tau": 2.0, "beta": 1.0}),
    ]
    (sheet,) = run_sheets(recs)
    assert [c.header for c in sheet.columns][-3:] == ["x base", "overhead", "verify"]
    assert _column(sheet, "overhead") == [None, None, pytest.approx(7.5), None,
                                          pytest.approx(1.2), None, None, None]
    assert _column(sheet, "wraps")[2] == "cpp_elastic"
    assert sheet.rows[2][-2].text == "7.50x cpp_elastic" and sheet.rows[6][-2].text == "-"
    assert "overhead" in sheet.caption
    assert overheads(recs) == {id(recs[2]): pytest.approx(7.5), id(recs[4]): pytest.approx(1.2)}


def test_attention_cells_match_on_causal_too_and_other_tables_have_no_column():
    shape = (1, 4, 128, 128, 64)
    causal, plain = {"tau": 1.0, "beta": 1.0, "causal": 1.0}, {"tau": 1.0, "beta": 1.0,
                                                               "causal": 0.0}
    recs = [
        _record("cpp_attention", 1e-3, shape=shape, params=plain, function="elastic_attention"),
        _record("cpp_attention", 2e-3, shape=shape, params=causal, function="elastic_attention"),
        _record("api_attention", 3e-3, shape=shape, params=causal, function="elastic_attention",
                wraps="cpp_attention"),
        _record("cpp_elastic_bwd", 1e-3, mode="bwd"),
    ]
    attention, rows = run_sheets(recs)
    assert _column(attention, "overhead") == [None, None, pytest.approx(1.5)]
    assert "overhead" not in [c.header for c in rows.columns]


def test_a_launch_column_last_where_records_say_how_they_launched():
    plan = "split 8x32768 (4096-chunks, 8 warps); backward split 8x32768 (4096-chunks, 8 warps)"
    recs = [_record("torch_softmax", 2e-6), _record("triton_elastic", 4e-6)]
    recs[1].launch = plan
    (sheet,) = run_sheets(recs)
    assert [c.header for c in sheet.columns][-2:] == ["verify", "launch"]
    assert _column(sheet, "launch") == [None, plan]
    assert sheet.rows[1][-1].text == plan and "launch:" in sheet.caption
    again = RunRecord.from_dict(json.loads(json.dumps(recs[1].to_dict())))
    assert again.launch == plan and "launch" not in recs[0].to_dict()
    (plain,) = run_sheets(recs[:1])
    assert "launch" not in [c.header for c in plain.columns]


def test_the_field_is_optional_in_results_files():
    r = _record("api_elastic", 1e-5, wraps="cpp_elastic")
    again = RunRecord.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again.wraps == "cpp_elastic"
    old = {k: v for k, v in r.to_dict().items() if k != "wraps"}  # a file from before it
    assert RunRecord.from_dict(old).wraps is None
    assert "wraps" not in _record("cpp_elastic", 1e-5).to_dict()


# ---------------------------------------------------------------- a tiny run, end to end

TIMING = """
[run.timing]
warmup_s = 0
min_reps = 3
max_reps = 5
budget_s = 0.05
min_sample_s = 0.0001
"""


def _rows_case(mode: str) -> str:
    return f"""
[run]
functions = ["elastic", "softmax"]
kernels = ["api_elastic", "{RAW["elastic", mode]}"]
baseline = "torch_softmax"
mode = "{mode}"
dtypes = ["fp32"]
sizes = ["4x256"]
verify = "verify-quick"
verify_inputs = ["normal"]
threads = 1
""" + TIMING


ATTENTION = f"""
[attention_run]
kernels = ["api_attention", "{RAW["elastic_attention", "fwd"]}"]
baseline = "sdpa"
dtypes = ["fp32"]
batch = 1
heads = 2
head_dim = 8
lengths = [16]
causal = [1]
modes = ["fwd", "bwd"]
[attention_run.timing]
warmup_s = 0.0
min_reps = 3
max_reps = 3
budget_s = 0.01
"""


@pytest.mark.parametrize("name,case", [("fwd", _rows_case("fwd")), ("bwd", _rows_case("bwd")),
                                       ("attention", ATTENTION)])
def test_a_tiny_run_records_the_raw_kernel_and_reports_the_overhead(cli, tmp_path, name, case):
    (tmp_path / "api.toml").write_text(case)
    out = tmp_path / "run.json"
    r = cli("run", "--case", str(tmp_path / "api.toml"), "--json", str(out))
    assert r.code == 0, r.out + r.err
    recs = json.loads(out.read_text())["records"]
    api = [x for x in recs if x["kernel"].startswith("api_")]
    assert api and all(x["verify"]["status"] == "pass" and x["ranked"] for x in api)
    for x in api:
        raw = RAW[x["function"], x["mode"]]
        assert x["wraps"] == raw
        (base,) = [y for y in recs if y["kernel"] == raw and y["mode"] == x["mode"]
                   and y["params"] == x["params"]]
        assert "wraps" not in base
        ratio = x["median_s"] / base["median_s"]
        assert f"{ratio:.2f}x {raw}" in r.out
    assert "overhead" in r.out
    rep = cli("report", str(out), "--format", "json")  # the report reads the records alone
    assert rep.code == 0, rep.err
    rows = [row for table in json.loads(rep.out)["files"][0]["tables"] for row in table["rows"]
            if row["kernel"].startswith("api_")]
    assert len(rows) == len(api)
    for row, x in zip(rows, api, strict=True):
        base = next(y for y in recs if y["kernel"] == x["wraps"] and y["mode"] == x["mode"]
                    and y["params"] == x["params"])
        assert row["wraps"] == x["wraps"]
        assert row["overhead"] == pytest.approx(x["median_s"] / base["median_s"])
