"""kernels/ imports as elasticbench.kernels from the editable install (tests/project/test_wheel.py
checks the same of a wheel) and reaches the benchmark only through the registry."""

from __future__ import annotations

from pathlib import Path

import pytest

import elasticbench
from elasticbench import list_kernels, register_kernel

ROOT = Path(__file__).resolve().parents[2]


def test_editable_install_maps_kernels_into_the_package():
    import elasticbench.kernels as k

    assert Path(k.__file__).resolve().parent == ROOT / "kernels"


def test_kernels_reach_the_benchmark_only_through_the_registry():
    # a kernel declares its passes with register_kernel(model=...), not by importing bench
    import ast

    for path in sorted((ROOT / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("elasticbench.harness.bench"), path


def test_public_api_lists_specs():
    specs = list_kernels()
    assert {"numpy_elastic", "torch_elastic"} <= {s.name for s in specs}
    s = next(s for s in specs if s.name == "numpy_elastic")
    assert (s.function, s.backend, callable(s.fn)) == ("elastic", "numpy", True)
    assert elasticbench.register_kernel is register_kernel


def test_register_kernel_checks_its_arguments():
    with pytest.raises(ValueError, match="unknown function"):
        register_kernel(function="softmax3", backend="numpy")
    with pytest.raises(ValueError, match="unknown mode"):
        register_kernel(function="softmax", backend="numpy", mode="sideways")

