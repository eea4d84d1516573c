"""kernels/ imports as elasticbench.kernels from the editable install and from a wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import elasticbench
from elasticbench import list_kernels, register_kernel

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import elasticbench, elasticbench.kernels as k; "
    "from elasticbench.verify.matrix import builtin_case, load_matrix; "
    "names = sorted(s.name for s in elasticbench.list_kernels() if s.backend == 'numpy'); "
    "load_matrix(builtin_case('verify')); "
    "print(k.__file__); print(','.join(names))"
)


def test_editable_install_maps_kernels_into_the_package():
    import elasticbench.kernels as k

    assert Path(k.__file__).resolve().parent == ROOT / "kernels"


def test_kernels_reach_the_benchmark_only_through_the_registry():
    # a kernel declares its passes with register_kernel(model=...), not by importing bench
    import ast

    for path in sorted((ROOT / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("elasticbench.bench"), path


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


@pytest.mark.slow
def test_wheel_installs_and_imports_without_the_source_tree(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(ROOT)],
        check=True, capture_output=True,
    )
    (wheel,) = wheels.glob("elasticbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "elasticbench/kernels/numpy_kernels.py" in names
    assert "elasticbench/kernels/triton/launch.py" in names  # subpackages of kernels/ too
    assert "elasticbench/cases/verify.toml" in names
    assert not any(n.startswith("kernels/") for n in names)  # nothing pollutes site-packages
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
         str(target), str(wheel)],
        check=True, capture_output=True,
    )
    # run from an empty directory with the wheel's copy first on the path
    env = {"PYTHONPATH": str(target), "PATH": ""}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith(str(target))
    assert "numpy_elastic" in out[1].split(",")
