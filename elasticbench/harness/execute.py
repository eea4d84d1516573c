"""Calling a kernel safely: fresh input, exceptions captured, input and aliasing watched.

Shared by verification and timing, so both see kernels the same way.
"""

from __future__ import annotations

import atexit
import pickle
import select
import signal
import subprocess
import sys
import sysconfig
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from elasticbench.harness.backends import Backend, get_backend
from elasticbench.harness.inputs.layouts import PACKED, Placement, place
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.worker import read_message, write_message

T = TypeVar("T")

MAX_FRAMES = 40  # the innermost frames of a kernel's traceback kept in its record
MAX_MESSAGE = 2000  # characters of an exception's message kept (compiler errors run long)


@dataclass
class Call:
    """What calling a kernel did, as plain data: its value, or the exception it raised (type,
    message, traceback); the warnings it issued; how long it took."""

    value: Any
    raised: dict[str, Any] | None
    warnings: list[dict[str, Any]]
    seconds: float

    @property
    def error(self) -> str | None:
        """The exception in one line, as failure reasons give it."""
        if self.raised is None:
            return None
        return f"raised {self.raised['type']}: {self.raised['message']}".splitlines()[0]


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.add(str(Path(__file__).resolve().parents[1]))  # elasticbench itself
    return tuple(sorted(d for d in dirs if d))


def exception_record(e: BaseException, skip: int = 1) -> dict[str, Any]:
    """An exception as plain data: its type and message, the frames below the harness's own
    `skip` frames (file, line, function, source line) and the innermost frame outside
    Python's and elasticbench's own libraries ("at": where the kernel's code raised)."""
    frames = traceback.extract_tb(e.__traceback__)[skip:][-MAX_FRAMES:]
    stack = [{"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line or ""}
             for f in frames]
    libraries = _library_dirs()
    mine = [f for f in stack if not str(Path(f["file"]).resolve()).startswith(libraries)]
    return {"type": type(e).__name__, "message": str(e)[:MAX_MESSAGE], "traceback": stack,
            "at": mine[-1] if mine else None}


def warning_records(caught: list[warnings.WarningMessage]) -> list[dict[str, Any]]:
    """Warnings as plain data, one entry per distinct (category, message, place), counted."""
    out: dict[tuple, dict[str, Any]] = {}
    for w in caught:
        key = (w.category.__name__, str(w.message), w.filename, w.lineno)
        if key in out:
            out[key]["count"] += 1
        else:
            out[key] = {"category": key[0], "message": key[1][:MAX_MESSAGE], "file": key[2],
                        "line": key[3], "count": 1}
    return list(out.values())


def guarded_call(backend: Backend, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Call:
    """fn(*args, **kwargs) as a verified call runs: inside the backend's calling context and
    synchronized, every warning collected (none reaches the terminal), an exception kept as a
    result rather than raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        try:
            with backend.calling():
                value = fn(*args, **kwargs)
            backend.synchronize()
        except Exception as e:  # a kernel's failure is a result, not a crash of the run
            return Call(None, exception_record(e), warning_records(caught),
                        time.perf_counter() - start)
        seconds = time.perf_counter() - start
    return Call(value, None, warning_records(caught), seconds)


@dataclass
class Outcome:
    """What one call of a kernel did."""

    output: np.ndarray | None  # the result as NumPy, None when the call failed
    error: str | None  # exception or contract violation, one line
    modified_input: bool
    returned_input: bool
    seconds: float
    raised: dict[str, Any] | None = None  # the exception, when it raised (exception_record)
    warnings: list[dict[str, Any]] = field(default_factory=list)  # what it warned
    wrote_outside: bool = False  # changed memory around its input (padding, before the offset)
    modified_args: list[str] = field(default_factory=list)  # the arguments it wrote to


def modified_reason(names: list[str]) -> str:
    """The failure reason of a kernel that wrote to its tensor arguments `names` (in the
    order the kernel takes them)."""
    return f"modified its input{'s' if len(names) > 1 else ''} {', '.join(names)}"


@dataclass
class NativeInput:
    """An input array laid out in its backend's memory: the kernel gets `view`."""

    backend: Backend
    placement: Placement
    base: Any  # the native buffer holding the view and its canaries
    view: Any

    @classmethod
    def make(cls, backend: Backend, a: np.ndarray, layout: str = PACKED) -> NativeInput:
        placement = place(a, layout)
        base = backend.to_native(placement.buffer)
        return cls(backend, placement, base, backend.view(base, placement))

    def changes(self) -> tuple[bool, bool]:
        """(changed inside the view, changed outside it) since it was made, bit for bit."""
        before = self.placement.buffer
        after = self.backend.to_numpy(self.base)
        bits = np.dtype(f"u{before.itemsize}")
        changed = after.view(bits) != before.view(bits)
        if not changed.any():
            return False, False
        inside = self.placement.inside()
        return bool((changed & inside).any()), bool((changed & ~inside).any())


def call_kernel(spec: KernelSpec, x: np.ndarray, params: dict[str, float],
                layout: str = PACKED) -> Outcome:
    """Run spec on a fresh copy of x (in the given layout) in its backend's array type and
    bring the result back."""
    backend = get_backend(spec.backend)
    arg = NativeInput.make(backend, x, layout)
    native = arg.view
    call = guarded_call(backend, spec.fn, native, **params)
    if call.raised is not None:
        return Outcome(None, call.error, False, False, call.seconds, call.raised, call.warnings)
    out = call.value
    returned_input = backend.same_memory(out, native)
    modified, outside = arg.changes()
    try:
        result = np.array(backend.to_numpy(out), copy=True)
    except TypeError as e:
        return Outcome(None, f"returned the wrong type: {e}", modified, returned_input,
                       call.seconds, warnings=call.warnings, wrote_outside=outside,
                       modified_args=["x"] if modified else [])
    return Outcome(result, None, modified, returned_input, call.seconds,
                   warnings=call.warnings, wrote_outside=outside,
                   modified_args=["x"] if modified else [])


def _warm_up() -> None:
    from elasticbench.harness.registry import list_kernels

    list_kernels()


def _death(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"crashed: killed by {name}{hint}"
    return f"crashed: its process exited with code {returncode}"


class Worker:
    """A child interpreter that runs calls for us; restarted whenever one kills it."""

    def __init__(self, warm: bool = True) -> None:
        """warm: wait, on starting, for the worker to load the built-in kernels (calls given
        a time limit); else the first call loads what it needs, and its caller goes on."""
        self.proc: subprocess.Popen | None = None
        self.warm = warm

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "elasticbench.harness.worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
            )
            if not self.warm:
                return self.proc
            # Load the built-in kernels (torch among them) before any call is timed: a
            # time limit is the kernel's, not the start-up's of a fresh interpreter.
            assert self.proc.stdin is not None and self.proc.stdout is not None
            try:
                write_message(self.proc.stdin, pickle.dumps(_warm_up))
                read_message(self.proc.stdout)
            except BrokenPipeError:
                pass  # it died starting: the call finds out and reports it
        return self.proc

    def stop(self) -> None:
        proc = self.proc  # read once: a thread collecting answers may drop it meanwhile
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.proc = None

    def call(self, call: Callable[[], T], timeout: float | None,
             failed: Callable[[str, float], T]) -> T:
        """call() in the worker; a crash, a kill or a hang past timeout gives failed()."""
        start = time.perf_counter()
        if not self.submit(call):
            return failed(_death(self.proc.wait() if self.proc else None),
                          time.perf_counter() - start)
        return self.collect(timeout, failed, start)

    def submit(self, call: Callable[[], Any], start: bool = True) -> bool:
        """Send call() to the worker (started if need be; with start False, only to one
        running already) without waiting for its answer; False when the worker died before
        taking it."""
        proc = self._start() if start else self.proc
        if proc is None:
            return False
        assert proc.stdin is not None
        try:
            write_message(proc.stdin, pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL))
        except BrokenPipeError:
            return False
        return True

    def collect(self, timeout: float | None, failed: Callable[[str, float], T],
                start: float | None = None) -> T:
        """The answer to the oldest call not yet answered; a crash, a kill or no answer within
        timeout gives failed(reason, seconds since start)."""
        start = time.perf_counter() if start is None else start
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        # no select without a limit: with several calls in flight, the next answer may be in
        # the reader's buffer already, and select would wait on the empty pipe for good
        if timeout is not None and not select.select([proc.stdout], [], [], timeout)[0]:
            self.stop()
            return failed(f"timed out after {timeout:g}s", time.perf_counter() - start)
        data = read_message(proc.stdout)
        if data is None:  # died before it could answer
            code = proc.wait()
            self.proc = None
            return failed(_death(code), time.perf_counter() - start)
        return pickle.loads(data)


_WORKER = Worker()
atexit.register(_WORKER.stop)


def in_child(call: Callable[[], T], timeout: float | None, failed: Callable[[str, float], T]) -> T:
    """call() in the worker process. call must pickle (functools.partial of module-level
    functions; registered kernels travel by name, their kernel files loaded there).

    A segfault, an out-of-memory kill or a hang past `timeout` seconds becomes
    failed(reason, seconds) instead of taking the caller down.
    """
    return _WORKER.call(call, timeout, failed)


@dataclass(frozen=True)
class Isolation:
    """How kernels are called: in-process (default, fast) or each call in a child process,
    optionally with a time limit (a limit implies a child: a hang cannot be cut otherwise)."""

    enabled: bool = False
    timeout: float | None = None

    @property
    def active(self) -> bool:
        return self.enabled or self.timeout is not None

    def run(self, call: Callable[[], T], failed: Callable[[str, float], T]) -> T:
        return in_child(call, self.timeout, failed) if self.active else call()


IN_PROCESS = Isolation()


def failed_outcome(reason: str, seconds: float) -> Outcome:
    return Outcome(None, reason, False, False, seconds)


def call_kernel_isolated(
    spec: KernelSpec, x: np.ndarray, params: dict[str, float], timeout: float | None
) -> Outcome:
    """call_kernel in a child process (see in_child)."""
    return in_child(partial(call_kernel, spec, x, params), timeout, failed_outcome)
