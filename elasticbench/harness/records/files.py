"""Results files: plain JSON with a versioned schema, written atomically as records arrive.

Reports and gates read these files, never live objects. A file is always complete JSON:
each flush writes a temporary file and renames it over the old one. Reading a file checks
every record against its record type and gives the typed records (a ResultsFile): a file
that does not fit is refused with one line naming the file, the record and the field, never
half-read.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticbench.harness.records.fields import RecordError, from_dict
from elasticbench.harness.records.run import RunRecord
from elasticbench.harness.records.verify import VerifyRecord

SCHEMA_VERSION = 1
Record = RunRecord | VerifyRecord
RECORD_TYPES: dict[str, type] = {"verify": VerifyRecord, "run": RunRecord}
KINDS = tuple(RECORD_TYPES)


class ResultsFileError(ValueError):
    """A results file is unreadable, malformed or of another schema."""


def schema_name(kind: str) -> str:
    return f"elasticbench.{kind}/{SCHEMA_VERSION}"


def _clean(obj: Any) -> Any:
    """Make obj strict JSON: non-finite floats become the strings 'nan', 'inf', '-inf'."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(_clean(obj), indent=1, allow_nan=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write text to path through a temporary file renamed over it: never half written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path: Path) -> None:
    """Raise OSError now if a results file cannot be created at path later."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory")
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".elasticbench-probe.")
    os.close(fd)
    os.unlink(tmp)


_SLOT = "\x00records\x00"  # where the records go in the header's JSON
WRITE_SHARE = 20  # a flush waits at least this many times as long as the last one took


class ResultsWriter:
    """Collects records and keeps `path` a complete results file at most `every` s behind
    (or WRITE_SHARE times the last write, for a file so large that writing it takes long).
    Records are never changed once added, so each is encoded to JSON once."""

    def __init__(self, path: Path | None, kind: str, meta: dict[str, Any], every: float = 2.0):
        if kind not in KINDS:
            raise ValueError(f"unknown results kind {kind!r}")
        self.path = None if path is None else Path(path)
        self.doc: dict[str, Any] = {"schema": schema_name(kind), "kind": kind, **meta,
                                    "complete": False, "records": []}
        self.every = every
        self._gap = every
        self._last = 0.0
        self._encoded: list[str] = []  # the first records' JSON, as they sit in the file

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.doc["records"]

    def add(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if time.monotonic() - self._last >= self._gap:
            self.flush()

    def flush(self) -> None:
        started = time.monotonic()
        if self.path is not None:
            write_text_atomic(self.path, self.text())
        self._last = time.monotonic()
        self._gap = max(self.every, WRITE_SHARE * (self._last - started))

    def text(self) -> str:
        """The file's text: what write_json_atomic writes for doc, byte for byte."""
        records = self.records
        if not records:
            return json.dumps(_clean(self.doc), indent=1, allow_nan=False) + "\n"
        for r in records[len(self._encoded):]:
            lines = json.dumps(_clean(r), indent=1, allow_nan=False).split("\n")
            self._encoded.append("\n".join("  " + line for line in lines))
        head = json.dumps(_clean({**self.doc, "records": [_SLOT]}), indent=1, allow_nan=False)
        return head.replace(f"  {json.dumps(_SLOT)}", ",\n".join(self._encoded), 1) + "\n"

    def close(self, complete: bool = True) -> None:
        self.doc["complete"] = complete
        self.flush()


def resume_writer(path: Path, kind: str, meta: dict[str, Any]) -> ResultsWriter:
    """A writer that continues the results file at path, keeping the records it has."""
    old = read_results(path, kind)
    writer = ResultsWriter(path, kind, meta)
    writer.records.extend(old["records"])
    writer.doc["resumed"] = old.get("resumed", 0) + 1
    return writer


def read_json(path: Path) -> Any:
    """The JSON in path; ResultsFileError says in one line why it cannot be had."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsFileError(f"results file {path} does not exist") from None
    except IsADirectoryError:
        raise ResultsFileError(f"results file {path} is a directory") from None
    except OSError as e:
        raise ResultsFileError(f"results file {path} cannot be read: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsFileError(f"results file {path} is not valid JSON: {e}") from None


@dataclass
class ResultsFile:
    """A results file read and checked: its document as written (the header, and the records
    as JSON objects, for copying on unchanged) and its records as typed records, in order."""

    source: str  # the path as given
    kind: str  # verify | run
    doc: dict[str, Any]
    records: list[Record]  # one per doc["records"], of the kind's record type


def check_results(doc: Any, path: Path | str, kind: str | None = None, *,
                  measured: bool = False) -> ResultsFile:
    """doc as a results file (of `kind`, if given); else ResultsFileError. With measured,
    each record must also hold what tables of it are drawn from (check_measured)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise ResultsFileError(f"results file {path} has no records list")
    expected = {schema_name(k) for k in ([kind] if kind else KINDS)}
    if doc.get("schema") not in expected:
        raise ResultsFileError(
            f"results file {path} has schema {doc.get('schema')!r}, "
            f"expected {' or '.join(sorted(expected))}"
        )
    kind_of = str(doc["schema"]).split(".", 1)[1].split("/")[0]
    records = [check_record(record, kind_of, path, i, measured=measured)
               for i, record in enumerate(doc["records"])]
    return ResultsFile(str(path), kind_of, doc, records)


def record_label(record: Any, index: int) -> str:
    """How an error names a record: its position, and its kernel when it has one."""
    kernel = record.get("kernel") if isinstance(record, dict) else None
    return f"record {index}" + (f" ({kernel})" if isinstance(kernel, str) else "")


def check_record(record: Any, kind: str, path: Path | str, index: int, *,
                 measured: bool = False) -> Record:
    """The typed record of a results file's record; ResultsFileError names the bad field."""
    try:
        typed = from_dict(RECORD_TYPES[kind], record)
        if measured:
            typed.check_measured()
        return typed
    except RecordError as e:
        where = f"results file {path}: {record_label(record, index)}"
        if e.field:
            raise ResultsFileError(f"{where}: field {e.field} {e.problem}") from None
        raise ResultsFileError(f"{where} {e.problem}") from None


def load_results(path: Path | str, kind: str | None = None, *,
                 measured: bool = False) -> ResultsFile:
    """Load and check a results file (see check_results); ResultsFileError says what is
    wrong in one line."""
    results = check_results(read_json(path), Path(path), kind, measured=measured)
    results.source = str(path)  # as given: how a report names the file
    return results


def read_results(path: Path | str, kind: str | None = None) -> dict[str, Any]:
    """The document of a results file as written, checked (see load_results)."""
    return load_results(path, kind).doc
