"""`run` on an [attention_run] case: kernels against SDPA, FLOP and copy ceilings, peak
memory, quadratic kernels left out where their scores would not fit (docs/attention.md 6)."""

from __future__ import annotations

import json

import pytest

from elasticbench.bench.attention import attention_bytes, attention_flops
from elasticbench.bench.attention_case import load_attention_run
from elasticbench.verify.tables import CaseFileError

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
