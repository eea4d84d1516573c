"""What a kernel call launched, in words, for the record of the run that timed it.

A kernel's host code calls `note("split 8x32768 (4096-chunks, 8 warps)")` (or `note` of a
function giving that line, formatted only while someone records) for each launch decision it
makes (a row plan, an attention tile configuration); the harness runs one call of
each timed kernel inside `noting()` and keeps what was noted as the record's `launch` field.
Outside `noting()` a note costs one context-variable read and is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_NOTES: ContextVar[list[str] | None] = ContextVar("elasticbench_launch_notes", default=None)


def note(description: str | Callable[[], str]) -> None:
    """Add one launch decision of the running call (nothing outside `noting()`); a callable
    is called only inside it, so that a call nobody records formats nothing."""
    notes = _NOTES.get()
    if notes is None:
        return
    text = description if isinstance(description, str) else description()
    if text not in notes:
        notes.append(text)


@contextmanager
def noting() -> Iterator[list[str]]:
    """Within the block, collect the distinct launch notes of the calls made, in order."""
    notes: list[str] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def summary(notes: list[str]) -> str | None:
    """The record's one-line form of a call's notes; None when it noted nothing."""
    return "; ".join(notes) or None
