"""Failing verification cases as notes a user can act on.

Every failing case is shown, grouped by kernel, input, shape, layout and parameters (the dtypes that
failed together in one group), worst first: what went wrong in each dtype (the worst element,
or the exception and the line that raised it, with the whole traceback on request), and one
command that re-runs exactly those cases. Kernel warnings are summed up apart. Works on
typed records (VerifyRecord) and the results file's header alone.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from elasticbench.harness.numerics.dtypes import DTYPE_NAMES
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.report.sheet import Note, Span, note

# built-in case -> its option (attention kernels' own matrix is their default)
MATRIX_OPTIONS = {"verify-quick": ["--quick"], "verify": [], "verify-attention": [],
                  "verify-attention-quick": ["--quick"]}


@dataclass(frozen=True)
class NoteOptions:
    """What the failure notes show: at most `failures` groups per kernel (None: all), and
    each raised exception's whole traceback."""

    failures: int | None = None
    tracebacks: bool = False


EVERY_FAILURE = NoteOptions()


def as_float(v: Any) -> float:
    """A record's number: None as 0, and every value that is not finite ('inf' or 'nan' as
    JSON stores them, read back as floats or not) as infinite."""
    if v is None:
        return 0.0
    if isinstance(v, str) or not math.isfinite(v):
        return math.inf
    return float(v)


def no_output(r: VerifyRecord) -> bool:
    """The kernel gave nothing to judge: it raised, crashed, timed out or returned junk."""
    return r.max_ulp is None and r.special_ok is None


def compile_failed(r: VerifyRecord) -> bool:
    return any(c.get("error") for c in (r.compile or {}).get("launches", []))


def severity(r: VerifyRecord) -> tuple[float, int]:
    """How bad a failing case is, for ordering (larger is worse): what does not compile or
    gives no output first, then special-value failures, then the share of the budget."""
    if compile_failed(r):
        return (math.inf, 3)
    if no_output(r):
        return (math.inf, 2)
    if r.special_ok is False:
        return (math.inf, 1)
    return (as_float(r.max_budget_frac), 0)


def format_number(v: float) -> str:
    """A parameter as an option value that parses back to the same float."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(float(v))


def shape_text(shape: Iterable[int]) -> str:
    return "x".join(str(v) for v in shape)


@dataclass
class FailureGroup:
    """The failing records of one kernel on one input, shape and parameters (a dtype each)."""

    records: list[VerifyRecord]

    @property
    def first(self) -> VerifyRecord:
        return self.records[0]

    @property
    def worst(self) -> VerifyRecord:
        return max(self.records, key=severity)

    @property
    def dtypes(self) -> list[str]:
        return [r.dtype for r in self.records]

    def describe(self) -> str:
        """input, shape, parameters and dtypes: "flat 2x8192 tau=1 beta=1 fp32, bf16"."""
        r = self.first
        params = " ".join(f"{k}={format_number(v)}" for k, v in r.params.items())
        return " ".join(p for p in (r.input, shape_text(r.shape),
                                    "" if r.layout == "packed" else r.layout, params,
                                    ", ".join(self.dtypes)) if p)


def group_failures(records: Iterable[VerifyRecord]) -> dict[tuple[str, str], list[FailureGroup]]:
    """(kernel, mode) -> its failing cases grouped by input, shape and parameters, the worst
    group first (dtypes in their usual order inside a group)."""
    groups: dict[tuple[str, str], dict[tuple, list[VerifyRecord]]] = {}
    for r in records:
        if r.passed:
            continue
        case = (r.input, tuple(r.shape), r.layout, tuple(sorted(r.params.items())))
        groups.setdefault((r.kernel, r.mode), {}).setdefault(case, []).append(r)
    order = {d: i for i, d in enumerate(DTYPE_NAMES)}
    out = {}
    for key, cases in groups.items():
        found = [FailureGroup(sorted(rs, key=lambda r: order.get(r.dtype, len(order))))
                 for rs in cases.values()]
        out[key] = sorted(found, key=lambda g: severity(g.worst), reverse=True)
    return out


def matrix_args(header: dict[str, Any]) -> list[str]:
    """The option that chooses the same verification matrix as the results file did."""
    builtin = header.get("matrix_builtin")
    if builtin in MATRIX_OPTIONS:
        return list(MATRIX_OPTIONS[builtin])
    return ["--case", str(header["matrix"])] if header.get("matrix") else []


def reproduce_command(group: FailureGroup, header: dict[str, Any]) -> str:
    """A shell command that re-runs exactly the group's cases: the same matrix, kernel, dtypes,
    input, shape and parameters, the budget scale, the kernel's file, and the environment its
    backend read."""
    r = group.first
    env = [f"{k}={shlex.quote(str(v))}" for k, v in (r.env or {}).items()]
    args = ["elasticbench", "verify", *matrix_args(header), "--only", r.kernel,
            "--dtype", ",".join(group.dtypes), "--input", r.input,
            "--size", shape_text(r.shape)]
    for k, v in r.params.items():
        args += ["--param", f"{k}={format_number(v)}"]
    args += ["--layout", r.layout]
    if r.mode != "fwd":
        args += ["--mode", r.mode]
    if r.budget_scale != 1:
        args += ["--budget-scale", format_number(r.budget_scale)]
    if r.source != "builtin":
        args += ["--kernel-file", r.source]
    return " ".join([*env, *(shlex.quote(a) for a in args)])


def _worst_element(r: VerifyRecord) -> str:
    w = r.worst
    if not w:
        return ""
    if isinstance(w.get("ulp"), float) and isinstance(w.get("allowed_ulp"), float):
        ulps = f" ({w['ulp']:.4g} ulp, allowed {w['allowed_ulp']:.4g})"
    elif isinstance(w.get("abs_err"), float) and isinstance(w.get("allowed_abs"), float):
        # at an exact 0 the error is absolute (verify/check.py element_error)
        ulps = f" (|error| {w['abs_err']:.4g}, allowed {w['allowed_abs']:.4g}, absolute)"
    else:
        ulps = ""
    return (f"at row {w['row']} index {w['index']}: input {w['input']!r}, expected "
            f"{w['expected']!r}, got {w['got']!r}{ulps}")


def _raised_at(r: VerifyRecord) -> str:
    at = (r.raised or {}).get("at")
    if not at:
        return ""
    code = f": {at['code']}" if at.get("code") else ""
    return f"raised at {at['file']}:{at['line']} in {at['function']}{code}"


def _what_happened(r: VerifyRecord, head_reason: str | None) -> str:
    """One record's detail: its reason where it differs from the group's, then where."""
    where = _raised_at(r) if r.raised else _worst_element(r)
    reason = r.reason if r.reason != head_reason else ""
    return "; ".join(p for p in (reason, where) if p)


def traceback_lines(raised: dict[str, Any]) -> list[str]:
    """A recorded exception as Python prints it: the kernel's frames, then the message."""
    lines = ["Traceback (most recent call last):"]
    for f in raised.get("traceback", []):
        lines.append(f'  File "{f["file"]}", line {f["line"]}, in {f["function"]}')
        if f.get("code"):
            lines.append(f"    {f['code']}")
    message = raised["message"].splitlines() or [""]
    lines.append(f"{raised['type']}: {message[0]}" if message[0] else raised["type"])
    return lines + message[1:]


def group_note(group: FailureGroup, header: dict[str, Any], options: NoteOptions) -> Note:
    """One failing group: the worst reason, what happened per dtype, how to reproduce it."""
    worst = group.worst
    mode = " bwd" if worst.mode != "fwd" else ""
    head_reason = worst.reason
    by_text: dict[str, list[str]] = {}  # dtypes whose details read the same are said once
    for r in group.records:
        by_text.setdefault(_what_happened(r, head_reason), []).append(r.dtype)
    details: list[list[Span | str]] = []
    for text, dtypes in by_text.items():
        if text:
            prefix = "" if len(group.records) == 1 else f"{', '.join(dtypes)}: "
            details.append([prefix + text])
    if options.tracebacks:
        shown: set[str] = set()
        for r in group.records:
            if r.raised:
                lines = traceback_lines(r.raised)
                if "\n".join(lines) not in shown:
                    shown.add("\n".join(lines))
                    details += [[Span(line, "code")] for line in lines]
    details.append(["reproduce: ", Span(reproduce_command(group, header), "code")])
    return note(Span("FAIL", "fail"), f" {worst.kernel}{mode} {group.describe()}: "
                                      f"{head_reason}", details=details)


def failure_notes(records: list[VerifyRecord], header: dict[str, Any],
                  options: NoteOptions = EVERY_FAILURE) -> list[Note]:
    """Every failing case of every kernel as notes, worst first per kernel, at most
    options.failures groups per kernel (a last note says how many were left out)."""
    notes = []
    for (kernel, mode), groups in group_failures(records).items():
        shown = groups if options.failures is None else groups[:options.failures]
        notes += [group_note(g, header, options) for g in shown]
        hidden = groups[len(shown):]
        if hidden:
            cases = sum(len(g.records) for g in hidden)
            what = f"{kernel}{' bwd' if mode != 'fwd' else ''}"
            notes.append(note(Span("FAIL", "fail"), f" {what}: {cases} more failing cases in "
                                                    f"{len(hidden)} groups not shown (--failures)"))
    return notes


def warning_notes(records: list[VerifyRecord]) -> list[Note]:
    """Per kernel, each distinct warning its calls issued, with how many cases issued it."""
    seen: dict[tuple[str, str], dict[tuple, list[int]]] = {}
    for r in records:
        mine = seen.setdefault((r.kernel, r.mode), {})
        for w in r.warnings or []:
            key = (w["category"], w["message"], w["file"], w["line"])
            counts = mine.setdefault(key, [0, 0])
            counts[0] += w.get("count", 1)
            counts[1] += 1
    notes = []
    for (kernel, mode), warned in seen.items():
        for (category, message, file, line), (count, cases) in warned.items():
            what = f"{kernel}{' bwd' if mode != 'fwd' else ''}"
            first = message.splitlines()[0] if message else ""
            times = f"{count} times in " if count != cases else "in "
            notes.append(note(Span("warned", "warn"),
                              f" {what}: {category}: {first} ({file}:{line}; {times}"
                              f"{cases} case{'s' if cases != 1 else ''})"))
    return notes
