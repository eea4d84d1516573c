"""Shared test fixtures: an isolated reference cache and a CLI runner with real exit codes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from elasticbench.cli import main


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep the truth cache of the tests out of the user's ~/.cache. Under pytest-xdist the
    workers share one (writes are atomic), so a truth is computed once per suite."""
    old = os.environ.get("ELASTICBENCH_CACHE")
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    os.environ["ELASTICBENCH_CACHE"] = str(shared / "truth-cache")
    yield
    if old is None:
        os.environ.pop("ELASTICBENCH_CACHE", None)
    else:
        os.environ["ELASTICBENCH_CACHE"] = old


@pytest.fixture(autouse=True, scope="session")
def _small_last_level_cache() -> Iterator[None]:
    """Runs in the tests assume a 32 MiB last-level cache, which the built-in cases were
    sized for: on a machine that reports a huge L3 (480 MiB on the project's VM) every run
    would otherwise copy two 1.9 GB buffers to measure its roofline."""
    old = os.environ.get("ELASTICBENCH_LLC_BYTES")
    os.environ["ELASTICBENCH_LLC_BYTES"] = "32M"
    yield
    if old is None:
        os.environ.pop("ELASTICBENCH_LLC_BYTES", None)
    else:
        os.environ["ELASTICBENCH_LLC_BYTES"] = old


@pytest.fixture(autouse=True)
def _fresh_user_kernels() -> Iterator[None]:
    """Kernels a test loads from its own files are forgotten after it (one process, many
    'invocations'), so two tests may both define a kernel called `mine`."""
    from elasticbench import registry

    with registry.scoped_kernels():
        yield


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run `elasticbench ARGS` in-process; return exit code, stdout and stderr."""

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run
