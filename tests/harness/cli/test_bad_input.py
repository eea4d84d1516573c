"""Malformed invocations and files: one clear line naming the problem, exit code 2, no
traceback, and no file left corrupted (an existing results file given as output stays
byte for byte what it was)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GOOD_RESULTS = {"schema": "elasticbench.verify/1", "kind": "verify", "complete": True,
                "records": []}

FILES = {
    "tau0.toml": '[verify]\ndtypes=["fp32"]\n[verify.params.elastic]\ntau=[0]\n'
                 '[[verify.inputs]]\ngenerator="normal"\nshapes=[[2,8]]\n',
    "betanan.toml": '[verify]\ndtypes=["fp32"]\n[verify.params.elastic]\nbeta=[nan]\n'
                    '[[verify.inputs]]\ngenerator="normal"\nshapes=[[2,8]]\n',
    "nogen.toml": '[verify]\n[[verify.inputs]]\nshapes=[[2,8]]\n',
    "broken.toml": "[verify\n",
    "runbad.toml": "[run]\nsizes = [[0, 5]]\n",
    "notjson.json": "not json",
    "old.json": json.dumps({"schema": "elasticbench.verify/0", "records": []}),
    "run.json": json.dumps({"schema": "elasticbench.run/1", "records": []}),
    "syntax.py": "from elasticbench import register_kernel\ndef broken(:\n",
    "importerr.py": "import numpy_that_does_not_exist\n",
}

# (argv, what the one line must say); OUT is an existing, valid results file.
CASES = [
    (["verify", "--function", "softmax2", "--json", "OUT"], "unknown function 'softmax2'"),
    (["verify", "--backend", "jax", "--json", "OUT"], "unknown backend 'jax'"),
    (["verify", "--dtype", "fp8", "--json", "OUT"], "unknown dtype 'fp8'"),
    (["verify", "--only", "nope", "--json", "OUT"], "unknown kernel 'nope'"),
    (["verify", "--input", "gauss", "--json", "OUT"], "unknown input 'gauss'"),
    (["verify", "--mode", "sideways", "--json", "OUT"], "unknown --mode 'sideways'"),
    (["verify", "--precision", "64", "--json", "OUT"], "at least 128"),
    (["verify", "--timeout", "-1", "--json", "OUT"], "--timeout must be a positive"),
    (["verify", "--case", "tau0.toml", "--json", "OUT"], "tau must be finite and > 0"),
    (["verify", "--case", "betanan.toml", "--json", "OUT"], "beta must be finite and >= 0"),
    (["verify", "--case", "nogen.toml", "--json", "OUT"], "needs a generator name"),
    (["verify", "--case", "broken.toml", "--json", "OUT"], "is not valid TOML"),
    (["verify", "--case", "missing.toml", "--json", "OUT"], "does not exist"),
    (["verify", "--kernel-file", "syntax.py", "--json", "OUT"], "syntax.py:2: syntax error"),
    (["verify", "--kernel-file", "importerr.py", "--json", "OUT"], "ModuleNotFoundError"),
    (["verify", "--resume", "run.json"], "expected elasticbench.verify/1"),
    (["verify", "--shard", "0/3", "--json", "OUT"], "1 <= K <= N"),
    (["run", "--size", "0x5", "--json", "OUT"], "rows >= 1 and n >= 1; got 0x5"),
    (["run", "--size", "4096", "--json", "OUT"], "a size is ROWSxN"),
    (["run", "--dtype", "fp12", "--json", "OUT"], "unknown dtype 'fp12'"),
    (["run", "--case", "runbad.toml", "--json", "OUT"], "run.sizes"),
    (["run", "--shard", "3/2", "--json", "OUT"], "1 <= K <= N"),
    (["report", "notjson.json", "-o", "OUT"], "is not valid JSON"),
    (["report", "old.json", "-o", "OUT"], "has schema 'elasticbench.verify/0'"),
    (["report", "missing.json", "-o", "OUT"], "does not exist"),
    (["gate", "old.json", "OUT"], "has schema 'elasticbench.verify/0'"),
    (["compare", "notjson.json", "OUT"], "is not valid JSON"),
    (["baseline", "save", "notjson.json"], "is not valid JSON"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "out.json").write_text(json.dumps(GOOD_RESULTS))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_there_are_enough_cases():
    assert len(CASES) >= 20


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(cli, workdir: Path, argv, message):
    out = workdir / "out.json"
    before = out.read_bytes()
    listing = sorted(p.name for p in workdir.iterdir())
    r = cli(*[str(out) if a == "OUT" else a for a in argv])
    assert r.code == 2, r.out + r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("elasticbench: error: "), r.err
    assert message in lines[0]
    assert "Traceback" not in r.err + r.out
    assert out.read_bytes() == before  # the existing results file is untouched
    assert sorted(p.name for p in workdir.iterdir()) == listing  # nothing new left behind


def test_a_bad_cache_size_override_is_one_line(cli, workdir: Path, monkeypatch):
    from elasticbench import settings
    from elasticbench.devices import llc_bytes
    from elasticbench.settings import parse_bytes

    assert parse_bytes("32M", "x") == 32 << 20 and parse_bytes("1GiB", "x") == 1 << 30
    assert parse_bytes("4096", "x") == 4096
    monkeypatch.setenv("ELASTICBENCH_LLC_BYTES", "64K")
    settings.refresh()  # read once: read it again
    assert llc_bytes("cpu") == 64 << 10
    monkeypatch.setenv("ELASTICBENCH_LLC_BYTES", "lots")
    r = cli("run", "--quick", "--json", str(workdir / "new.json"))
    assert r.code == 2 and "ELASTICBENCH_LLC_BYTES='lots'" in r.err and "Traceback" not in r.err
    assert not (workdir / "new.json").exists()
