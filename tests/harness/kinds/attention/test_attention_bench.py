"""`run` on an [attention_run] case: kernels against SDPA, FLOP and copy ceilings, peak
memory, quadratic kernels left out where their scores would not fit (docs/attention.md 6)."""

from __future__ import annotations

import json
import math

import pytest

from elasticbench.harness.kinds.attention.run_case import load_attention_run
from elasticbench.harness.kinds.attention.run_job import attention_bytes, attention_flops
from elasticbench.harness.verify.tables import CaseFileError

TINY = """
[attention_run]
kernels = ["torch_attention_flash", "torch_attention_composite"]
baseline = "sdpa"
dtypes = ["fp32"]
batch = 1
heads = 2
head_dim = 8
lengths = [16, 48]
causal = [0, 1]
modes = ["fwd", "bwd"]
quadratic = ["torch_attention_composite"]
quadratic_limit_gib = 0.00002
[attention_run.timing]
warmup_s = 0.0
min_reps = 3
max_reps = 3
budget_s = 0.01
"""


def test_flops_and_bytes_models():
    assert attention_flops(1, 2, 8, 8, 4, False, "fwd") == 4 * 2 * 64 * 4
    assert attention_flops(1, 2, 8, 8, 4, True, "fwd") == 4 * 2 * 36 * 4  # 8 * 9 / 2 seen
    assert attention_flops(1, 1, 4, 4, 2, False, "bwd") == 10 * 16 * 2
    assert attention_bytes(1, 1, 4, 4, 2, 4, "fwd") == 4 * 8 * 4
    assert attention_bytes(1, 1, 4, 4, 2, 4, "bwd") == 8 * 8 * 4


def test_run_times_attention_against_sdpa_and_leaves_out_what_does_not_fit(cli, tmp_path):
    case = tmp_path / "att.toml"
    case.write_text(TINY)
    out = tmp_path / "run.json"
    r = cli("run", "--case", str(case), "--json", str(out))
    assert r.code == 0, r.out + r.err
    doc = json.loads(out.read_text())
    recs = doc["records"]
    assert doc["ceilings"]["matmul_gflops"]["fp32"]["ceiling"] > 0
    # composite (quadratic) only at L=16: 16^2 x 2 heads x 4 B x 3 = 6 KiB fits, 48 does not
    comp = {(x["mode"], x["shape"][2]) for x in recs if x["kernel"] == "torch_attention_composite"}
    assert comp == {("fwd", 16), ("bwd", 16)}
    assert len(doc["skipped"]) == 2 and "skipped torch_attention_composite" in r.out
    flash = [x for x in recs if x["kernel"] == "torch_attention_flash"]
    assert len(flash) == 8 and all(x["speedup"] > 0 and x["ranked"] for x in flash)
    for x in flash:
        b, h, lq, lk, d = x["shape"]
        want = attention_flops(b, h, lq, lk, d, bool(x["params"]["causal"]), x["mode"])
        assert x["flops"] == want
        assert x["gflops"] == pytest.approx(want / x["median_s"] / 1e9)
        assert x["binding"] in ("matmul", "memory") and x["verify"]["status"] == "pass"
        assert x["params"]["tau"] == 1.0 and "peak_bytes" in x
    assert all(x["baseline"] for x in recs if x["kernel"] == "sdpa")
    assert "GFLOP/s" in r.out and "1x2x48x8 causal" in r.out
    rep = cli("report", str(out))
    assert rep.code == 0 and "matmul GFLOP/s" in rep.out


def test_bad_attention_case_is_one_line(cli, tmp_path):
    case = tmp_path / "bad.toml"
    case.write_text(TINY.replace('modes = ["fwd", "bwd"]', 'modes = ["sideways"]'))
    r = cli("run", "--case", str(case))
    assert r.code == 2 and "sideways" in r.err and r.err.count("\n") == 1
    with pytest.raises(CaseFileError, match="not an attention kernel"):
        case.write_text(TINY.replace('"torch_attention_flash",', '"torch_elastic",'))
        load_attention_run(case)


def test_padded_cells_give_sdpa_and_the_kernels_the_same_key_padding(cli, tmp_path):
    case = tmp_path / "pad.toml"
    case.write_text(TINY.replace("lengths = [16, 48]", "lengths = [16]\npadded = [0.5]")
                    .replace("causal = [0, 1]", "causal = [0]"))
    out = tmp_path / "run.json"
    r = cli("run", "--case", str(case), "--json", str(out))
    assert r.code == 0, r.out + r.err
    recs = json.loads(out.read_text())["records"]
    assert {x["kernel"] for x in recs} == {"sdpa", "torch_attention_flash",
                                           "torch_attention_composite"}
    assert all(x["params"]["padded"] == 0.5 for x in recs)
    assert all(x["speedup"] > 0 for x in recs if not x["baseline"])
    assert "padded" in r.out  # the size column says so (wrapped to the terminal)


FAMILY = """
[attention_run]
kernels = ["cpp_attention", "cpp_symax_attention", "cpp_sigmoid_attention"]
optional_kernels = ["cpp_stablemax_attention", "no_such_attention"]
baseline = "sdpa"
dtypes = ["fp32"]
batch = 1
heads = 2
head_dim = 8
lengths = [16, 32]
causal = [0]
modes = ["fwd"]
[attention_run.params]
tau = 2.0
[attention_run.params.symax_attention]
eta = 0.25
[attention_run.timing]
warmup_s = 0.0
min_reps = 3
max_reps = 3
budget_s = 0.01
"""


def test_each_function_gets_its_own_row_parameters(tmp_path):
    case = tmp_path / "fam.toml"
    case.write_text(FAMILY)
    c = load_attention_run(case)
    assert c.function_params["elastic_attention"] == {"tau": 2.0, "beta": 1.0}
    assert c.function_params["symax_attention"] == {"eta": 0.25}
    assert c.function_params["stablemax_attention"] == {}
    assert c.row_params("sigmoid_attention", 32) == {"bias": pytest.approx(-math.log(32))}
    case.write_text(FAMILY.replace("eta = 0.25", "eta = 0.25\n"
                                   "[attention_run.params.sigmoid_attention]\nbias = -1.5"))
    assert load_attention_run(case).row_params("sigmoid_attention", 32) == {"bias": -1.5}
    bad = {("eta = 0.25", "tau = 0.5"): "symax_attention has no row parameter 'tau'",
           ("[attention_run.params.symax_attention]", "[attention_run.params.x_attention]"):
               "no kernel of the case computes 'x_attention'",
           ("tau = 2.0", "eta = 2.0\ngamma = 1.0"): "no kernel's function has a parameter 'gamma'",
           ("eta = 0.25\n", "eta = -1.0\n"): "eta must be finite and >= 0",
           ("eta = 0.25\n", 'eta = "per length"\n'): "eta"}
    for (old, new), why in bad.items():
        case.write_text(FAMILY.replace(old, new))
        with pytest.raises(CaseFileError, match=why):
            load_attention_run(case)


def test_family_run_records_each_kernels_parameters_and_unregistered_ones(cli, tmp_path):
    case = tmp_path / "fam.toml"
    case.write_text(FAMILY)
    out = tmp_path / "run.json"
    r = cli("run", "--case", str(case), "--json", str(out))
    assert r.code == 0, r.out + r.err
    doc = json.loads(out.read_text())
    params = {(x["kernel"], x["shape"][2]): x["params"] for x in doc["records"]}
    assert params[("cpp_symax_attention", 16)] == {"eta": 0.25, "causal": 0.0}
    assert params[("cpp_attention", 32)] == {"tau": 2.0, "beta": 1.0, "causal": 0.0}
    assert params[("cpp_sigmoid_attention", 32)]["bias"] == pytest.approx(-math.log(32))
    assert params[("cpp_stablemax_attention", 16)] == {"causal": 0.0}
    assert params[("sdpa", 16)] == {"causal": 0.0}
    assert all(x["speedup"] > 0 for x in doc["records"] if not x["baseline"])
    missing = [s for s in doc["skipped"] if "no_such_attention" in s]
    assert len(missing) == 1 and missing[0].startswith("no_such_attention: not registered here")
    assert "no_such_attention" in r.out  # the run says so too
    rep = cli("report", str(out))
    assert rep.code == 0 and "symax_attention (fwd)" in rep.out
    assert "sigmoid_attention (fwd)" in rep.out
    # a name in `kernels` must be registered: one line, exit 2
    case.write_text(FAMILY.replace('"cpp_attention",', '"no_such_attention",'))
    r = cli("run", "--case", str(case))
    assert r.code == 2 and "unknown kernel 'no_such_attention'" in r.err
    assert r.err.count("\n") == 1
