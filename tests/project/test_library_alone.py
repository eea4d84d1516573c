"""The library stands alone beside the harness that judges it (docs/dispatch.md
section 1): importing elasticbench.functional and elasticbench.nn, and a forward and
backward through them on the CPU, load no module of the harness and none of the harness's
third-party dependencies. Each check runs in a fresh interpreter, so nothing this test
process imported counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The library: the public API, its ops, what they dispatch with, and the kernels each device
# runs (kernels/triton, kernels/cpp). Every other module of elasticbench is the harness's.
LIBRARY = ("functional", "nn", "domains", "dispatch", "devices", "launches", "native", "rows",
           "attention", "integrations", "settings", "kernels.triton", "kernels.cpp")

# The harness: everything under elasticbench/harness (the commands, verifying, running,
# searching, gating, reporting, its records and sessions, the exact reference with its
# definitions and inputs, the registry and its built-in registrations), the command line's
# entry module, and the Triton interpreter's patch (a test's tool, off the library's path).
HARNESS = ("__main__", "harness", "triton_interpreter")

# The harness's third-party dependencies (pyproject.toml) and the transformers integration's:
# the library needs none of them.
THIRD_PARTY = ("mpmath", "gmpy2", "click", "rich", "scipy", "transformers")

# After each step of a fresh interpreter's code: every module name loaded, as a JSON line.
REPORT = "\nprint(json.dumps(sorted(sys.modules)))\n"

CALLS = """
import torch
from elasticbench import functional as F
from elasticbench.nn import ElasticAttention, ElasticSoftmax
g = torch.Generator().manual_seed(0)
x = torch.randn(3, 17, generator=g, requires_grad=True)
tau = torch.tensor(0.7, requires_grad=True)
F.elastic_softmax(x, tau, 0.5).sum().backward()
ElasticSoftmax(tau=0.5, beta=1.0)(x).sum().backward()
q, k, v = (torch.randn(1, 2, 5, 4, generator=g, requires_grad=True) for _ in range(3))
F.elastic_attention(q, k, v, tau=0.8, beta=1.0, causal=True).sum().backward()
ElasticAttention(tau=0.8, beta=1.0)(q, k, v).sum().backward()
F.symax_attention(q, k, v, eta=0.5).sum().backward()
F.sigmoid_attention(q, k, v).sum().backward()
assert x.grad is not None and tau.grad is not None and q.grad is not None
"""


def loaded(*steps: str) -> list[list[str]]:
    """The modules one fresh interpreter has loaded after each of the steps, run in turn."""
    code = "import json, sys\n" + "".join(step + REPORT for step in steps)
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-4000:]
    return [json.loads(line) for line in child.stdout.splitlines()[-len(steps):]]


def harness_in(modules: list[str]) -> list[str]:
    """The modules of the harness, and the harness's third-party packages, among modules."""
    names = tuple(f"elasticbench.{h}" for h in HARNESS) + THIRD_PARTY
    return sorted(m for m in modules if m in names or m.startswith(tuple(n + "." for n in names)))


def test_every_module_is_the_library_s_or_the_harness_s() -> None:
    """A new module must be placed on one side (LIBRARY or HARNESS above); the two packages
    themselves (elasticbench, elasticbench.kernels) import nothing and are neither."""
    files = [(p.relative_to(ROOT / "elasticbench"), ()) for p in (ROOT / "elasticbench").rglob("*.py")]
    files += [(p.relative_to(ROOT / "kernels"), ("kernels",)) for p in (ROOT / "kernels").rglob("*.py")]
    found = {(*package, *(n for n in path.with_suffix("").parts if n != "__init__"))
             for path, package in files}
    sides = [tuple(n.split(".")) for n in (*LIBRARY, *HARNESS)]
    unplaced = sorted(".".join(parts) for parts in found - {(), ("kernels",)}
                      if not any(parts[:len(side)] == side for side in sides))
    assert unplaced == []
    assert not set(LIBRARY) & set(HARNESS)


def test_the_library_and_a_forward_and_backward_on_the_cpu_load_nothing_of_the_harness() -> None:
    """The import alone, then elastic_softmax, ElasticSoftmax and the attention functions,
    each differentiated: the native kernels where they are built (the library's extension,
    never the harness's), else the torch code. (One interpreter: its start is seconds.)"""
    imported, called = loaded("import elasticbench.functional, elasticbench.nn", CALLS)
    assert "elasticbench.functional" in imported and "elasticbench.nn" in imported
    assert harness_in(imported) == []
    assert "elasticbench.rows.ops" in called and "elasticbench.attention.flash" in called
    assert harness_in(called) == []
    assert not [m for m in called if m.startswith("elasticbench_reference")]


def test_the_triton_kernels_import_nothing_of_the_harness() -> None:
    pytest.importorskip("triton")
    [modules] = loaded("import elasticbench.kernels.triton.tier, "
                     "elasticbench.kernels.triton.flash_attention, "
                     "elasticbench.kernels.triton.exp_family, "
                     "elasticbench.kernels.triton.weight_family, "
                     "elasticbench.kernels.triton.elastic_backward")
    assert "elasticbench.kernels.triton.flash_attention" in modules
    assert harness_in(modules) == []


def test_the_check_sees_a_harness_module() -> None:
    """harness_in finds a harness module, a submodule of a harness package and a third-party
    package of the harness's, and nothing of the library."""
    modules = ["elasticbench.harness.registry", "elasticbench.harness.numerics.certified.dd", "mpmath.libmp",
               "elasticbench.functional", "elasticbench.rows.ops", "torch",
               "elasticbench.kernels.triton.tier", "elasticbench.harness.builtin.torch_kernels"]
    assert harness_in(modules) == ["elasticbench.harness.builtin.torch_kernels",
                                   "elasticbench.harness.numerics.certified.dd", "elasticbench.harness.registry",
                                   "mpmath.libmp"]
