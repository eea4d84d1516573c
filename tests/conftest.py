"""Shared test fixtures: an isolated reference cache, a CLI runner with real exit codes, the
`needs` marker for what a test needs of this machine, and a child pytest under Triton's
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from elasticbench import devices, settings
from elasticbench.harness.cli import main
from elasticbench.harness.registry import scoped_kernels

# What `@pytest.mark.needs(...)` can ask for (pyproject.toml registers the marker): each gives
# None when this machine has it, else the reason the test is skipped. elasticbench.devices
# answers; no test asks the machine itself.
NEEDS: dict[str, Callable[[], str | None]] = {
    "gpu": lambda: None if devices.has_gpu() else "no CUDA GPU here",
    "no_gpu": lambda: "Triton runs on this GPU" if devices.has_gpu() else None,
    "triton": lambda: None if devices.triton_installed() else "Triton is not installed",
    "native": lambda: (f"cannot build here: {why}"  # a build can be tried (and must succeed)
                       if (why := devices.native_unbuildable()) else None),
}


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker but the first compiles torch.compile's graphs into an
    Inductor cache of its own, the first's name (the caller's TORCHINDUCTOR_CACHE_DIR, else
    Inductor's default) with the worker's id: two processes compiling into one cache at once
    have loaded each other's half-written libraries ("file too short"). The first keeps the
    caller's, which CI's earlier steps warm. Set before anything compiles; the child
    processes a test starts inherit it (and keep it: it already ends in the worker's id)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if worker != "gw0" and not (base or "").endswith(f"_{worker}"):
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{base or default_cache_dir()}_{worker}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip each test marked `needs(what, ...)` unless this machine has all of them (each
    asked once per session)."""
    answers: dict[str, str | None] = {}
    for item in items:
        for mark in item.iter_markers("needs"):
            for what in mark.args:
                if what not in NEEDS:
                    raise pytest.UsageError(f"needs({what!r}): choose from {', '.join(NEEDS)}")
                if what not in answers:
                    answers[what] = NEEDS[what]()
                if answers[what] is not None:
                    item.add_marker(pytest.mark.skip(reason=answers[what]))


@pytest.fixture
def under_interpreter() -> Callable[..., None]:
    """Run a test module again in a child pytest with Triton's interpreter on, and require
    that its tests pass: the interpreter must be on before `triton.jit` decorates a kernel,
    and importing the Triton kernels would change what every other test of this process
    sees in the registry. Called as under_interpreter(__file__, *pytest_args, timeout=s)."""

    def run(test_file: str, *args: str, timeout: float = 600) -> None:
        cmd = [sys.executable, "-m", "pytest", str(Path(test_file)), "-q", "-p",
               "no:cacheprovider", "-W", "ignore::RuntimeWarning", *args]
        child = subprocess.run(cmd, env=devices.interpreter_env(on=True), capture_output=True,
                               text=True, timeout=timeout)
        tail = (child.stdout + child.stderr)[-6000:]
        assert child.returncode == 0, tail
        assert " passed" in child.stdout and " failed" not in child.stdout, tail

    return run


@pytest.fixture(autouse=True, scope="session")
def _test_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's environment, read into elasticbench.settings before any test and restored
    after: the truth cache out of the user's ~/.cache (under pytest-xdist the workers share
    one, writes being atomic, so a truth is computed once per suite), and a 32 MiB
    last-level cache, which the built-in cases were sized for (on a machine that reports a
    huge L3, 480 MiB on the project's VM, every run would otherwise copy two 1.9 GB buffers
    to measure its roofline). Collection may have read the settings already: refreshed."""
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    ours = {"ELASTICBENCH_CACHE": str(shared / "truth-cache"), "ELASTICBENCH_LLC_BYTES": "32M"}
    old = {name: os.environ.get(name) for name in ours}
    os.environ.update(ours)
    settings.refresh()
    yield
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    settings.refresh()


@pytest.fixture(autouse=True)
def _fresh_user_kernels() -> Iterator[None]:
    """Kernels a test loads from its own files are forgotten after it (one process, many
    'invocations'), so two tests may both define a kernel called `mine`."""
    from elasticbench.harness import registry

    with registry.scoped_kernels():
        yield


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run `elasticbench ARGS` in-process; return exit code, stdout and stderr. Kernel files
    the command loads are forgotten after it, as they would be with its process."""

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            with scoped_kernels():
                main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run
