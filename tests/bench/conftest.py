"""pytest-benchmark suite: runs only when asked for, never inside the normal test run.

    pytest tests/bench --benchmark-only [--benchmark-save=NAME --benchmark-save-data]

The project's pytest configuration passes --benchmark-disable; asking for --benchmark-only
(or --benchmark-enable) here turns benchmarking back on. Without either, these tests are
skipped, so `make test` spends no time on them.
"""

from __future__ import annotations

import pytest

from elasticbench.harness.allocator import pin_heap
from elasticbench.harness.bench.cases import RunCase
from elasticbench.harness.bench.runner import set_threads


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # pytest-benchmark refuses --benchmark-only together with the --benchmark-disable of the
    # project's addopts; --benchmark-only clearly means "run them", so it implies enable.
    if config.getoption("benchmark_only", False):
        config.option.benchmark_enable = True


@pytest.fixture(scope="session", autouse=True)
def timed_like_run() -> None:
    """The process settings `elasticbench run` times under: its threads (the default case's,
    every core) and a heap that keeps freed memory (see elasticbench.harness.bench.runner)."""
    set_threads(RunCase(name="bench").threads)
    pin_heap()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    enabled = config.getoption("benchmark_enable", False) or not config.getoption(
        "benchmark_disable", False)
    if enabled:
        return
    skip = pytest.mark.skip(reason="benchmarks run only with --benchmark-only")
    for item in items:
        if "tests/bench/" in item.nodeid or item.nodeid.startswith("bench/"):
            item.add_marker(skip)
