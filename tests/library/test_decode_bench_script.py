"""scripts/decode_bench.py: its plumbing at a tiny size (a report, no timed assertion), and
bad input as one line and exit code 2."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "decode_bench.py"


def _main(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    spec = importlib.util.spec_from_file_location("decode_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["decode_bench.py", *argv])
    threads = torch.get_num_threads()
    try:
        return module.main()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.needs("native")
def test_it_reports_three_calls(monkeypatch, capsys) -> None:
    assert _main(monkeypatch, "--heads", "2", "--cache", "64", "--queries", "3", "--dim",
                 "8", "--rounds", "1", "--calls", "1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("decode step: B=1 H=2 Lq=3 Lk=64 D=8 fp32, 1 thread(s)")
    assert [line.split()[0] for line in lines[2:]] == ["sdpa", "elastic_attention", "native"]
    assert lines[2].endswith("1.00x")


def test_more_queries_than_cached_keys_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    assert _main(monkeypatch, "--queries", "9", "--cache", "4") == 2
    err = capsys.readouterr().err
    assert err.strip() == "decode_bench: --queries (9) must not exceed --cache (4)"


@pytest.mark.needs("native")
def test_grouped_query_decoding_adds_the_packed_step(monkeypatch, capsys) -> None:
    assert _main(monkeypatch, "--heads", "4", "--kv-heads", "2", "--cache", "32", "--dim",
                 "8", "--rounds", "1", "--calls", "1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("decode step: B=1 H=4 Hkv=2 Lq=1 Lk=32 D=8 fp32")
    assert [line.split()[0] for line in lines[2:]] == ["sdpa", "elastic_attention", "native",
                                                       "elastic"]
    assert lines[5].startswith("elastic packed")


@pytest.mark.needs("native")
def test_grouped_query_with_several_queries_has_no_packed_step(monkeypatch, capsys) -> None:
    assert _main(monkeypatch, "--heads", "4", "--kv-heads", "1", "--cache", "32", "--queries",
                 "2", "--dim", "8", "--rounds", "1", "--calls", "1") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("decode step: B=1 H=4 Hkv=1 Lq=2 Lk=32 D=8 fp32")
    assert [line.split()[0] for line in lines[2:]] == ["sdpa", "elastic_attention", "native"]


@pytest.mark.parametrize("kv", ["3", "16"])
def test_kv_heads_that_do_not_divide_the_heads_are_one_line_and_exit_2(monkeypatch, capsys,
                                                                        kv) -> None:
    assert _main(monkeypatch, "--heads", "8", "--kv-heads", kv) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"decode_bench: --kv-heads ({kv}) must divide --heads (8)"
