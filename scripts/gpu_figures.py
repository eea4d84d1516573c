"""What every step of scripts/gpu_checks.sh shares: the figures file, the step's work folder,
the device and commit it records, and one-line errors.

scripts/gpu_checks.py (the driver) sets, for each step it starts:

    GPU_CHECKS_FIGURES  the JSON-lines file every figure is appended to (OUT/figures.jsonl)
    GPU_CHECKS_WORK     the folder the step's own files go to (archived after every step)
    GPU_CHECKS_STEP     the step's name
    GPU_CHECKS_COMMIT   the commit checked out, GPU_CHECKS_DEVICE the device's name
    GPU_CHECKS_DRY_RUN  "1" in the dry run: tiny shapes on the CPU under Triton's interpreter

`Figures.add` appends one JSON object per figure and flushes it at once, so a step killed by
its time limit keeps every figure it measured. Run by hand (none of these set), a script
writes no figures (its printed lines hold the same values).

This module imports only the standard library: the driver and the environment step import it
before they know whether torch works.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def dry_run() -> bool:
    """Whether the driver runs the dry run (tiny shapes, the CPU, Triton's interpreter)."""
    return os.environ.get("GPU_CHECKS_DRY_RUN") == "1"


def work_dir() -> Path | None:
    """The step's folder for its own files (archived by the driver); None run by hand."""
    raw = os.environ.get("GPU_CHECKS_WORK")
    if not raw:
        return None
    path = Path(raw)
    path.mkdir(parents=True, exist_ok=True)
    return path


def work_file(name: str, fallback: str | None = None) -> str | None:
    """The path of a file called name in the work folder, else fallback (run by hand)."""
    folder = work_dir()
    return str(folder / name) if folder is not None else fallback


def one_line(e: BaseException) -> str:
    """The innermost cause's type and its message's first nonblank line, at most 240
    characters (Triton's interpreter wraps a kernel's error once per call level)."""
    seen = {id(e)}
    while e.__cause__ is not None and id(e.__cause__) not in seen:
        e = e.__cause__
        seen.add(id(e))
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def commit() -> str | None:
    """The commit the driver recorded, else git's HEAD, else None."""
    if os.environ.get("GPU_CHECKS_COMMIT"):
        return os.environ["GPU_CHECKS_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=ROOT, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _clean(value: Any) -> Any:
    """JSON without NaN or inf (strict parsers refuse them): those become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Figures:
    """Appends the figures of one step to the driver's figures file as they are measured."""

    def __init__(self, step: str | None = None, device: str | None = None):
        self.step = step or os.environ.get("GPU_CHECKS_STEP") or "manual"
        self.device = device or os.environ.get("GPU_CHECKS_DEVICE")
        self.commit = commit()
        raw = os.environ.get("GPU_CHECKS_FIGURES")
        self.path = Path(raw) if raw else None

    def add(self, name: str, value: float | int | bool | None, unit: str, **fields: Any) -> dict:
        """Append one figure: its name, value (None where it could not be measured; a bool
        as 0/1), unit, and any of shape, dtype, status, error, note...; returns the object."""
        if isinstance(value, bool):
            value = int(value)
        rec = {"step": self.step, "name": name, "value": _clean(value), "unit": unit,
               **{k: _clean(v) for k, v in fields.items()},
               "device": self.device, "commit": self.commit, "time": round(time.time(), 3)}
        line = json.dumps(rec, default=str)
        if self.path is not None:  # run by hand, the script's own lines say it all
            with open(self.path, "a") as f:
                f.write(line + "\n")
                f.flush()
        return rec


def timer(on_cuda: bool) -> Callable[[Callable[[], Any]], float]:
    """ms of a call: do_bench's median (L2 flushed) on CUDA; elsewhere (the dry run, which
    checks plumbing: its figures mean nothing) the median of two perf_counter calls after
    one untimed."""
    if on_cuda:
        from triton.testing import do_bench

        return lambda fn: float(do_bench(fn, return_mode="median"))

    def timed(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times)

    return timed
