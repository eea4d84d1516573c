"""What `verify` prints about a third-party kernel: every failure, legible cells, raised
kernels with their exception, and reproduce lines that reproduce.

The kernels are small third-party-style files (tests/fixtures/sibling) or written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
LOWP = str(FIXTURES / "sibling" / "lowp_softmax.py")


@pytest.fixture(autouse=True)
def _plain(monkeypatch):
    for var in ("COLUMNS", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(var, raising=False)


def test_piped_output_is_never_wrapped(cli):
    r = cli("verify", "--quick", "--kernel-file", LOWP, "-d", "bf16", "--input", "specials")
    assert r.code == 1
    line = next(ln for ln in r.out.splitlines() if "reproduce:" in ln)
    assert line.rstrip().endswith(f"--kernel-file {LOWP}"), line
    assert max(len(ln) for ln in r.out.splitlines()) > 80
