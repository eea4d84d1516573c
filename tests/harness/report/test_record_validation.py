"""Results files are checked against the record types when read: a hand-edited record that
does not fit is one line naming the file, the record and the field, exit code 2, in every
command that reads results; the gate never passes on a file it could not read, and a file
that cannot be resumed is left as it was."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from elasticbench.harness.records import (
    RunRecord,
    VerifyRecord,
    load_results,
    read_results,
    record_key,
)
from elasticbench.harness.records.fields import RecordError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
RUN = json.loads((FIXTURES / "run_small.json").read_text())
VERIFY = json.loads((FIXTURES / "verify_small.json").read_text())
TIMED = 3  # a record of run_small.json that was timed (not one that raised)


def _set(field: str, value) -> Callable[[dict], None]:
    def edit(record: dict) -> None:
        record[field] = value
    return edit


def _sample(i: int, value: float) -> Callable[[dict], None]:
    def edit(record: dict) -> None:
        record["timing"]["samples_ns"][i] = value
    return edit


# (how the record is spoiled, what the one line must name)
RUN_EDITS = {
    "median-fast": (_set("median_s", "fast"), "field median_s must be a number, got 'fast'"),
    "sample-nan": (_sample(1, math.nan), "field timing.samples_ns[1] must be a finite number"),
    "sample-1e308": (_sample(0, 1e308), "field timing.samples_ns[0] must be a time"),
    "shape-bad": (_set("shape", [-1, "x"]), "field shape[0] must be > 0, got -1"),
    "no-samples": (lambda r: r["timing"].update(samples_ns=[]),
                   "field timing.samples_ns must hold at least one sample"),
    "gbps-negative": (_set("gbps", -3.0), "field gbps must be > 0"),
}


def _spoil(tmp_path: Path, name: str, doc: dict, index: int,
           edit: Callable[[dict], None]) -> Path:
    bad = copy.deepcopy(doc)
    edit(bad["records"][index])
    path = tmp_path / name
    path.write_text(json.dumps(bad))  # NaN written as NaN, as a hand edit would
    return path


def _one_line(r, path: Path, index: int, kernel: str, message: str) -> None:
    assert r.code == 2, r.out + r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("elasticbench: error: "), r.err
    assert f"results file {path}: record {index} ({kernel})" in lines[0], lines[0]
    assert message in lines[0], lines[0]
    assert "Traceback" not in r.err + r.out and "PASS" not in r.out


@pytest.mark.parametrize("edit", list(RUN_EDITS))
@pytest.mark.parametrize("command", ["report", "compare", "gate", "merge", "resume"])
def test_spoiled_run_record_is_one_line_exit_2(cli, tmp_path, monkeypatch, command, edit):
    monkeypatch.chdir(tmp_path)
    spoil, message = RUN_EDITS[edit]
    good = tmp_path / "good.json"
    good.write_text(json.dumps(RUN))
    bad = _spoil(tmp_path, "bad.json", RUN, TIMED, spoil)
    before = bad.read_bytes()
    argv = {"report": ["report", str(bad)],
            "compare": ["compare", str(good), str(bad)],
            "gate": ["gate", str(good), str(bad)],
            "merge": ["merge", str(bad), "-o", str(tmp_path / "merged.json")],
            "resume": ["run", "--quick", "--resume", str(bad)]}[command]
    r = cli(*argv)
    _one_line(r, bad, TIMED, RUN["records"][TIMED]["kernel"], message)
    assert bad.read_bytes() == before  # nothing already computed is lost
    assert not (tmp_path / "merged.json").exists()


@pytest.mark.parametrize("command", ["report", "gate", "resume"])
def test_spoiled_verify_record_is_one_line_exit_2(cli, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(VERIFY))
    bad = _spoil(tmp_path, "bad.json", VERIFY, 5, _set("passed", "yes"))
    argv = {"report": ["report", str(bad)], "gate": ["gate", str(good), str(bad)],
            "resume": ["verify", "--quick", "--resume", str(bad)]}[command]
    r = cli(*argv)
    _one_line(r, bad, 5, VERIFY["records"][5]["kernel"], "field passed must be true or false")


def test_the_fixtures_are_valid_and_round_trip():
    for doc, kind in ((RUN, RunRecord), (VERIFY, VerifyRecord)):
        for r in doc["records"]:
            typed = kind.from_dict(r)
            assert kind.from_dict(typed.to_dict()) == typed


def test_the_typed_key_is_the_key_of_the_record_as_written():
    # verify --resume keys the cases it plans from JSON objects, merge and gates key typed
    # records: both must agree, defaults (mode fwd, layout packed) included
    for doc, kind in ((RUN, RunRecord), (VERIFY, VerifyRecord)):
        keys = [kind.from_dict(r).key for r in doc["records"]]
        assert keys == [record_key(r) for r in doc["records"]]
        assert len(set(keys)) == len(keys)
    assert {k[7] for k in keys} == {"packed"} and "layout" not in VERIFY["records"][0]


def test_a_run_record_without_its_measurement_is_gated_but_not_reported(cli, tmp_path):
    doc = copy.deepcopy(RUN)
    del doc["records"][TIMED]["gbps"], doc["records"][TIMED]["binding"]
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(doc))
    typed = load_results(path).records
    assert typed[TIMED].gbps is None and typed[TIMED].timing is not None
    with pytest.raises(RecordError, match=r"^lacks gbps, binding$"):
        typed[TIMED].check_measured()
    for r in typed:  # the others hold their measurement, or raised and need none
        if r is not typed[TIMED]:
            r.check_measured()
    assert sum(r.error is not None for r in typed) == 2
    _one_line(cli("report", str(path)), path, TIMED, RUN["records"][TIMED]["kernel"],
              "lacks gbps, binding")
    r = cli("gate", str(path), str(path))
    assert r.code == 0 and "PASS" in r.out, r.out + r.err


def test_the_record_types_read_back_what_the_files_hold():
    doc = read_results(FIXTURES / "run_small.json", "run")
    typed = [RunRecord.from_dict(r) for r in doc["records"]]
    assert sum(t.failed for t in typed) == 6 and sum(t.error is not None for t in typed) == 2
    assert typed[TIMED].timing is not None and typed[TIMED].timing.samples_ns == \
        doc["records"][TIMED]["timing"]["samples_ns"]
    v = [VerifyRecord.from_dict(r) for r in read_results(FIXTURES / "verify_small.json")["records"]]
    assert any(x.max_ulp == math.inf for x in v)  # stored as "inf", read back as a float
    assert sum(x.failed for x in v) == 8


def test_a_record_error_names_the_nested_field():
    r = copy.deepcopy(RUN["records"][TIMED])
    r["verify"]["status"] = "maybe"
    with pytest.raises(RecordError) as e:
        RunRecord.from_dict(r)
    assert e.value.field == "verify.status" and "'pass', 'FAIL', 'unverified'" in e.value.problem
    r = copy.deepcopy(VERIFY["records"][0])
    del r["input"], r["seed"]
    with pytest.raises(RecordError, match="lacks input, seed"):
        VerifyRecord.from_dict(r)


def test_the_writer_encodes_each_record_once_and_writes_what_json_dumps_would(tmp_path):
    """Records are encoded as they arrive and kept; the file is byte for byte the whole
    document's JSON, header keys added after the records included."""
    import json

    from elasticbench.harness.records import files

    path = tmp_path / "r.json"
    w = files.ResultsWriter(path, "verify", {"machine": {"cpu": "x"}}, every=0.0)
    w.flush()
    assert path.read_text() == json.dumps(w.doc, indent=1) + "\n"
    for i in range(3):
        w.add({"kernel": f"k{i}", "max_ulp": float("inf") if i else 0.5,
               "worst": {"row": i, "got": [1.0, float("nan")]}, "failures": {}, "none": []})
    w.doc["reference"] = {"elements": 3}
    w.close()
    expected = json.dumps(files._clean(w.doc), indent=1, allow_nan=False) + "\n"
    assert path.read_text() == expected
    assert len(w._encoded) == 3
    assert json.loads(path.read_text())["records"][1]["max_ulp"] == "inf"
