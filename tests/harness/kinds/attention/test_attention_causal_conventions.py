"""Issue 57 item 2: a kernel declares where its causal diagonal lies (top-left, SDPA's, the
default; or bottom-right, FlashAttention's); the reference follows the declaration, the
record names it, and a kernel that fails under its declared convention but passes under the
other is told so. Small fp32 shapes with length_q != length_k both ways, and one query
against a cache (decoding)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from elasticbench.harness.kinds.attention.kernel_contract import causal_offset, causal_reference
from elasticbench.harness.kinds.attention.verify_job import prepare, verify_attention_one
from elasticbench.harness.kinds.attention.verify_matrix import AttentionCase, load_attention_matrix
from elasticbench.harness.registry import (
    get_kernel,
    load_kernel_file,
    register_kernel,
    scoped_kernels,
)

ROOT = Path(__file__).resolve().parents[4]
FIXTURE = ROOT / "tests" / "fixtures" / "bottom_right_attention.py"
SHAPES = [(1, 2, 3, 7, 4), (1, 1, 6, 3, 4), (2, 1, 1, 9, 4)]  # lq < lk, lq > lk, decoding


def _case(shape, causal=1.0, generator="normal") -> AttentionCase:
    return AttentionCase(function="elastic_attention", generator=generator, shape=shape,
                         dtype="fp32", params=(("tau", 0.5), ("beta", 1.0),
                                               ("causal", causal)), seed=5)


def _judge(spec, case):
    return verify_attention_one(spec, prepare(case, "fwd", None, 128))


def test_the_bottom_right_reference_hides_keys_past_the_shifted_diagonal():
    params = {"tau": 1.0, "beta": 0.0, "causal": 1.0}
    same, bias = causal_reference(params, (1, 1, 2, 4, 3), None, "top_left")
    assert same is params and bias is None
    ref, bias = causal_reference(params, (1, 1, 2, 4, 3), None, "bottom_right")
    assert ref["causal"] == 0.0 and causal_offset(2, 4, "bottom_right") == 2
    np.testing.assert_array_equal(np.isfinite(bias[0, 0]),
                                  [[True, True, True, False], [True, True, True, True]])
    # equal lengths: the conventions agree, and the reference is the case's own
    assert causal_reference(params, (1, 1, 3, 3, 3), None, "bottom_right") == (params, None)
    with pytest.raises(ValueError, match="unknown causal convention 'bottom-right'"):
        causal_offset(2, 4, "bottom-right")


@pytest.mark.parametrize("shape", SHAPES)
def test_a_declared_bottom_right_kernel_passes_and_the_record_says_so(shape):
    with scoped_kernels():
        load_kernel_file(FIXTURE)
        spec = get_kernel("library_bottom_right")
        record = _judge(spec, _case(shape))
        assert record.passed, record.reason
        assert record.causal == "bottom_right"
        # the same code declared top-left fails, and the failure names the way out
        wrong = _judge(replace(spec, causal="top_left"), _case(shape))
    assert not wrong.passed and wrong.causal == "top_left"
    assert ("passes under causal='bottom_right': declare it in the kernel's contract"
            in wrong.reason), wrong.reason


def test_a_top_left_kernel_declared_bottom_right_is_told_the_reverse():
    composite = get_kernel("torch_attention_composite")
    assert composite.causal == "top_left"
    record = _judge(replace(composite, causal="bottom_right"), _case(SHAPES[0]))
    assert not record.passed
    assert "passes under causal='top_left'" in record.reason, record.reason
    assert _judge(composite, _case(SHAPES[0])).passed


def test_where_the_conventions_agree_either_declaration_passes_without_a_hint():
    with scoped_kernels():
        load_kernel_file(FIXTURE)
        spec = get_kernel("library_bottom_right")
        for case in (_case((1, 2, 5, 5, 4)), _case(SHAPES[0], causal=0.0)):
            for convention in ("top_left", "bottom_right"):
                record = _judge(replace(spec, causal=convention), case)
                assert record.passed, (case, convention, record.reason)


def test_a_wrong_bottom_right_kernel_gets_no_hint():
    # off by a relative 1e-3 everywhere: wrong under both conventions, so no convention helps
    with scoped_kernels():
        load_kernel_file(FIXTURE)
        good = get_kernel("library_bottom_right").fn

        def off(q, k, v, **kw):
            return good(q, k, v, **kw) * (1 + 1e-3)

        bad = replace(get_kernel("library_bottom_right"), name="off", fn=off,
                      causal="top_left")
        record = _judge(bad, _case(SHAPES[0]))
    assert not record.passed and "passes under" not in record.reason


def test_the_declaration_is_checked_when_the_kernel_registers():
    with pytest.raises(ValueError, match="unknown causal convention 'flash'"):
        register_kernel(function="elastic_attention", backend="torch", causal="flash")
    with pytest.raises(ValueError, match="causal is for attention kernels"):
        register_kernel(function="elastic", backend="numpy", causal="bottom_right")


def test_the_default_matrix_has_causal_cases_of_unequal_lengths_both_ways_and_decoding():
    matrix = load_attention_matrix(ROOT / "cases" / "verify-attention.toml")
    shapes = {tuple(s[2:4]) for inputs in matrix.inputs for s in inputs.shapes}
    assert any(lq < lk for lq, lk in shapes) and any(lq > lk for lq, lk in shapes)
    assert any(lq == 1 < lk for lq, lk in shapes)
    assert 1.0 in matrix.params["elastic_attention"]["causal"]


def test_verify_names_the_convention_and_hints_in_the_failure_line(cli, tmp_path):
    args = ["verify", "--only", "{}", "-d", "fp32", "--size", "1x1x3x7x4", "--param",
            "causal=1", "--param", "tau=0.5", "--param", "beta=1", "--input", "normal"]
    r = cli(*[a.format("library_bottom_right") for a in args], "--kernel-file", str(FIXTURE))
    assert r.code == 0, r.out + r.err
    assert "wide bottom_right" in r.out and "2 passed" in r.out
    # the same code registered without the declaration: judged top-left, failed, hinted
    undeclared = tmp_path / "undeclared_bottom_right.py"
    undeclared.write_text(FIXTURE.read_text().replace(
        'name="library_bottom_right",\n                causal="bottom_right", ',
        'name="undeclared",\n                '))
    r = cli(*[a.format("undeclared") for a in args], "--kernel-file", str(undeclared))
    assert r.code == 1
    # (the table wraps its lines at the terminal's width)
    assert ("passes under causal='bottom_right': declare it in the kernel's contract"
            in " ".join(r.out.split()))


def test_a_record_keeps_its_convention_and_older_files_read_without_one():
    from elasticbench.harness.records import VerifyRecord

    old = {"kernel": "k", "function": "elastic_attention", "backend": "torch",
           "dtype": "fp32", "shape": [1, 1, 3, 7, 4], "input": "normal", "seed": 1,
           "passed": True}
    assert VerifyRecord.from_dict(old).causal is None  # judged top-left, as every one then
    record = VerifyRecord.from_dict({**old, "causal": "bottom_right"})
    assert record.causal == "bottom_right"
    assert VerifyRecord.from_dict(record.to_dict()).causal == "bottom_right"
    with pytest.raises(ValueError, match="causal"):
        VerifyRecord.from_dict({**old, "causal": "bottom-right"})


def test_a_resumed_file_refuses_a_kernel_whose_declaration_changed(cli, tmp_path):
    out = tmp_path / "v.json"
    args = ["verify", "--only", "library_bottom_right", "-d", "fp32", "--size", "1x1x3x7x4",
            "--param", "causal=1", "--param", "tau=0.5", "--param", "beta=1",
            "--input", "normal", "--kernel-file", str(FIXTURE)]
    assert cli(*args, "--json", str(out)).code == 0
    # the same kernel re-declared top-left: its bottom-right records cannot stand for it
    redeclared = tmp_path / "redeclared.py"
    redeclared.write_text(FIXTURE.read_text().replace('causal="bottom_right", ', ''))
    r = cli(*args[:-1], str(redeclared), "--resume", str(out))
    assert r.code == 2
    assert ("judged library_bottom_right under causal='bottom_right'; it declares "
            "'top_left' now") in r.out + r.err
    assert cli(*args, "--resume", str(out)).code == 0  # unchanged: resumes
