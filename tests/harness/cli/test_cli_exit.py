"""The console script's exit (elasticbench.harness.cli.entry / leave): as sys.exit would end, atexit
handlers and buffered output included, only without the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("code", [0, 3])
def test_leave_runs_atexit_handlers_and_flushes_output(tmp_path: Path, code: int):
    mark = tmp_path / "atexit-ran"
    proc = _python(
        "import atexit, pathlib, sys\n"
        f"atexit.register(pathlib.Path({str(mark)!r}).write_text, 'yes')\n"
        "from elasticbench.harness.cli import leave\n"
        "sys.stdout.write('buffered, no newline')\n"
        f"leave({code})\n"
        "print('not reached')\n")
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "buffered, no newline"
    assert mark.read_text() == "yes"


def test_a_text_exit_code_and_a_running_thread_take_the_ordinary_exit(tmp_path: Path):
    proc = _python("from elasticbench.harness.cli import leave\nleave('a message')\n")
    assert proc.returncode == 1 and proc.stderr.strip() == "a message"
    done = tmp_path / "thread-done"
    proc = _python(
        "import pathlib, threading, time\n"
        "from elasticbench.harness.cli import leave\n"
        f"def late(): time.sleep(0.5); pathlib.Path({str(done)!r}).write_text('done')\n"
        "threading.Thread(target=late).start()\n"
        "leave(0)\n")
    assert proc.returncode == 0, proc.stderr
    assert done.read_text() == "done"  # os._exit would have cut the thread off


def test_python_m_elasticbench_keeps_exit_codes_and_one_line_errors():
    proc = subprocess.run([sys.executable, "-m", "elasticbench", "verify", "--mode", "sideways"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "elasticbench: error: unknown --mode 'sideways' (choose from fwd, bwd, both)"]
    proc = subprocess.run([sys.executable, "-m", "elasticbench", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: ")
