"""The library's row ops as the registry holds them: every kernel the modules that register
the library's ops (native pass structures, Triton row kernels, torch tiers, public API calls)
put in the registry, with its name, function, backend, mode, description, formats, pass model,
accuracy, flags and call signature, equals the snapshot tests/fixtures/row_ops_registry.json,
taken from the per-backend modules before their kernels moved into one table per row
function (elasticbench/harness/builtin/row_ops.py). Records, baselines and gates are keyed by
these names, so a change to one must be deliberate: rewrite the snapshot with
`python tests/harness/builtin/test_row_ops_registry.py --write` and say why.

The registry is read in a fresh interpreter, which imports the Triton module wherever Triton
is installed (its backend need not run here) and the native one wherever it builds, without
leaving their kernels in this process's registry.
"""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "row_ops_registry.json"
PACKAGE = "elasticbench.harness.builtin"
MODULES = {f"{PACKAGE}.torch_kernels": "torch", f"{PACKAGE}.triton_kernels": "triton",
           f"{PACKAGE}.cpp_kernels": "cpp", f"{PACKAGE}.api_kernels": "torch"}


def _call(fn: Any) -> str:
    """fn's parameters as the contract binds them, without annotations: (x, *, tau, beta)."""
    sig = inspect.signature(fn)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def registered() -> dict[str, Any]:
    """The modules imported here and, in registration order, each kernel they registered."""
    from elasticbench import devices
    from elasticbench.harness.backends import get_backend
    from elasticbench.harness.kernel_spec import REGISTRY
    from elasticbench.harness.registry import list_kernels

    list_kernels()  # the built-ins whose backend runs here
    loaded = []
    for module, backend in MODULES.items():
        if backend == "triton" and not devices.triton_installed():
            continue
        if backend != "triton" and not get_backend(backend).available():
            continue
        importlib.import_module(module)
        loaded.append(module)
    kernels = []
    for spec in REGISTRY.specs():
        fn = spec.fn
        if fn.__module__ not in MODULES:
            continue
        own = getattr(sys.modules[fn.__module__], fn.__name__, None) is fn
        wraps = getattr(fn, "wraps", None)
        kernels.append({
            "module": fn.__module__, "attribute": fn.__name__ if own else None,
            "name": spec.name, "function": spec.function, "backend": spec.backend,
            "mode": spec.mode, "description": spec.description, "baseline": spec.baseline,
            "dtypes": None if spec.dtypes is None else list(spec.dtypes),
            "model": None if spec.model is None else spec.model.to_dict(),
            "accuracy": spec.accuracy, "compiles": spec.compiles,
            "param_form": spec.param_form, "causal": spec.causal, "call": _call(fn),
            "wraps": None if wraps is None else list(wraps.args),
        })
    return {"loaded": loaded, "kernels": kernels}


def test_the_row_ops_register_exactly_as_the_snapshot_records(tmp_path: Path) -> None:
    out = tmp_path / "registered.json"
    child = subprocess.run([sys.executable, __file__, str(out)], capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-4000:]
    got = json.loads(out.read_text())
    snapshot = json.loads(FIXTURE.read_text())
    assert {k["module"] for k in snapshot} == set(MODULES)
    assert {f"{PACKAGE}.torch_kernels", f"{PACKAGE}.api_kernels"} <= set(got["loaded"])
    for module in got["loaded"]:  # each module's kernels in its order (modules load by backend)
        have = [k for k in got["kernels"] if k["module"] == module]
        want = [k for k in snapshot if k["module"] == module]
        assert [(k["name"], k["mode"]) for k in have] == [(k["name"], k["mode"]) for k in want]
        for h, w in zip(have, want, strict=True):
            assert h == w, (h["name"], h["mode"])


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:  # a new snapshot: every module must load here
        found = registered()
        assert found["loaded"] == list(MODULES), found["loaded"]
        FIXTURE.write_text(json.dumps(found["kernels"], indent=1) + "\n")
    else:
        Path(sys.argv[1]).write_text(json.dumps(registered()))
