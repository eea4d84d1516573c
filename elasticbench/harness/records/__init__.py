"""Records and results files: the typed records run and verify emit, defined once
(run.py, verify.py, checked field by field by fields.py), and the files that hold them
(files.py). Everything downstream (reports, gates, merge, --resume) reads these files."""

from __future__ import annotations

from elasticbench.harness.records.fields import RecordError
from elasticbench.harness.records.files import (
    KINDS,
    RECORD_TYPES,
    SCHEMA_VERSION,
    Record,
    ResultsFile,
    ResultsFileError,
    ResultsWriter,
    check_record,
    check_results,
    check_writable,
    load_results,
    read_json,
    read_results,
    resume_writer,
    schema_name,
    write_json_atomic,
)
from elasticbench.harness.records.identity import IDENTITY_FIELDS, record_key
from elasticbench.harness.records.run import (
    BenchmarkNoiseFloorEntry,
    NoiseFloorEntry,
    QuickVerdict,
    RunRecord,
    TimingRecord,
)
from elasticbench.harness.records.verify import VerifyRecord

__all__ = ["IDENTITY_FIELDS", "KINDS", "RECORD_TYPES", "SCHEMA_VERSION",
           "BenchmarkNoiseFloorEntry", "NoiseFloorEntry", "QuickVerdict",
           "Record", "RecordError", "ResultsFile", "ResultsFileError", "ResultsWriter", "RunRecord",
           "TimingRecord", "VerifyRecord", "check_record", "check_results", "check_writable",
           "load_results", "read_json", "read_results", "record_key", "resume_writer",
           "schema_name", "write_json_atomic"]
