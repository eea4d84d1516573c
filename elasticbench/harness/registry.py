"""The one kernel registry: built-in kernels and the ones users bring in kernel files.

    from elasticbench import register_kernel

    @register_kernel(function="elastic", backend="numpy", name="my_elastic")
    def my_elastic(x, *, tau, beta): ...

Row kernels take one array of rows; attention kernels (function elastic_attention or
softmax_attention) take q, k, v: their contract is docs/attention.md section 4. Both kinds
share this registry; a kernel's `kind` says which it is.

This module is the registry's face: it loads the built-in kernel modules and users' kernel
files and answers which kernels there are. What a kernel is and `register_kernel` live in
elasticbench.harness.kernel_spec, below the kernel modules, which import it from there.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from elasticbench.harness.backends import get_backend
from elasticbench.harness.functions import ATTENTION, function_kind
from elasticbench.harness.kernel_spec import (
    MODES,
    REGISTRY,
    KernelRegistry,
    KernelSpec,
    register_kernel,
    registering_from,
    set_resolver,
)

# The built-in kernel modules, in loading order, and the backend each registers kernels of;
# one is imported only where its backend is available, and one not installed is skipped.
BUILTINS: dict[str, str] = {
    "elasticbench.harness.builtin.numpy_kernels": "numpy",
    "elasticbench.harness.builtin.torch_kernels": "torch",
    "elasticbench.harness.builtin.triton_kernels": "triton",
    "elasticbench.harness.builtin.triton_attention": "triton",
    "elasticbench.harness.builtin.torch_variants": "torch",
    "elasticbench.harness.builtin.torch_attention": "torch",
    "elasticbench.harness.builtin.cpp_kernels": "cpp",
    "elasticbench.harness.builtin.cpp_attention": "cpp",
    "elasticbench.harness.builtin.api_kernels": "torch",
    "elasticbench.harness.builtin.sdpa_kernels": "torch",
    "elasticbench.harness.builtin.flex_attention": "flex_attention",
}
BUILTIN_MODULES = tuple(BUILTINS)
_builtins_loaded = False

__all__ = [
    "BUILTINS", "BUILTIN_MODULES", "MODES", "KernelFileError", "KernelRegistry", "KernelSpec",
    "get_kernel", "list_kernels", "load_kernel_file", "register_kernel",
    "scoped_kernels", "select_kernels",
]


class KernelFileError(Exception):
    """A kernel file could not be loaded; the message names the file and line."""


def _builtin_backends() -> list[str]:
    return list(dict.fromkeys(BUILTINS.values()))


def _load_builtins() -> None:
    """Import, once, the built-in kernel modules whose backend is available; one that is
    not installed (being added, say) is skipped."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for module, backend in BUILTINS.items():
        if get_backend(backend).available() and importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


@contextmanager
def scoped_kernels(*, alone: bool = False) -> Iterator[None]:
    """Kernels registered inside the block (kernel files loaded in it) are forgotten after
    it; the built-ins are loaded first, so they stay. alone=True hides every kernel
    registered before the block while it runs (see KernelRegistry.scoped)."""
    _load_builtins()
    with REGISTRY.scoped(alone=alone):
        yield


def _resolve(name: str, mode: str, source: str) -> KernelSpec:
    """The registered kernel (name, mode), loading its kernel file first if need be."""
    _load_builtins()
    if REGISTRY.get(name, mode) is None and source != "builtin":
        load_kernel_file(source)
    return get_kernel(name, mode)


set_resolver(_resolve)


def list_kernels(
    function: str | None = None, backend: str | None = None, mode: str | None = None
) -> list[KernelSpec]:
    """Registered kernels (built-ins included), optionally filtered, in registration order."""
    _load_builtins()
    return [
        k
        for k in REGISTRY.specs()
        if (function is None or k.function == function)
        and (backend is None or k.backend == backend)
        and (mode is None or k.mode == mode)
    ]


def get_kernel(name: str, mode: str = "fwd") -> KernelSpec:
    _load_builtins()
    spec = REGISTRY.get(name, mode)
    if spec is None:
        known = ", ".join(sorted(k.name for k in REGISTRY.specs() if k.mode == mode))
        skipped = [f"the {b} built-ins ({why})" for b in _builtin_backends()
                   if (why := get_backend(b).unavailable())]
        note = f"; not loaded: {'; '.join(skipped)}" if skipped else ""
        raise ValueError(f"unknown kernel {name!r} (registered: {known}){note}")
    return spec


def load_kernel_file(path: str | Path) -> list[KernelSpec]:
    """Import a user's kernel file; return the kernels it registered.

    As pytest does for test files, the file's directory goes first on the import path, so
    the file can import modules beside it; a sibling that imports the file by name gets
    this same module. Any failure becomes a KernelFileError naming the file and the line.
    """
    _load_builtins()
    p = Path(path)
    if not p.is_file():
        raise KernelFileError(f"kernel file {p} does not exist")
    directory = str(p.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module_name = f"elasticbench_user_{abs(hash(str(p.resolve())))}"
    aliases = [module_name] + ([p.stem] if _importable_as(p.stem, p) else [])
    with registering_from(str(p)) as keys:
        _exec_kernel_file(p, module_name, aliases)
    return [spec for k in dict.fromkeys(keys) if (spec := REGISTRY.get(*k)) is not None]


def _exec_kernel_file(p: Path, module_name: str, aliases: list[str]) -> None:
    """Execute the kernel file p as the module `module_name` (also known as `aliases`),
    every failure turned into a KernelFileError."""
    try:
        spec = importlib.util.spec_from_file_location(module_name, p)
        if spec is None or spec.loader is None:
            raise KernelFileError(f"kernel file {p} cannot be imported")
        module = importlib.util.module_from_spec(spec)
        sys.modules.update(dict.fromkeys(aliases, module))
        try:
            spec.loader.exec_module(module)
        except BaseException:
            for name in aliases:  # as a failed import does: no half-made module stays
                sys.modules.pop(name, None)
            raise
    except KernelFileError:
        raise
    except SyntaxError as e:
        raise KernelFileError(f"{p}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # any error raised while importing the user's file
        raise KernelFileError(f"{_where(e, p)}: {type(e).__name__}: {e}") from None


def _importable_as(name: str, path: Path) -> bool:
    """Whether `import name` would find the file at path and nothing of that name is loaded."""
    if not name.isidentifier() or name in sys.modules:
        return False
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return (found is not None and found.origin is not None
            and Path(found.origin).resolve() == path.resolve())


def _where(exc: BaseException, path: Path) -> str:
    """file:line of the deepest frame of exc inside the user's file."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            line = frame.lineno
    return f"{path}:{line}" if line else str(path)


def select_kernels(
    functions: Iterable[str] = (),
    backends: Iterable[str] = (),
    only: Iterable[str] = (),
    mode: str = "fwd",
) -> list[KernelSpec]:
    """Kernels matching every given filter (an empty filter matches all but baselines,
    which are chosen by name only, and attention kernels, chosen by their function's name
    or by name). Names are checked."""
    functions, backends, only = list(functions), list(backends), list(only)
    for f in functions:
        function_kind(f)
    for b in backends:
        get_backend(b)
    for name in only:
        get_kernel(name, mode)
    return [
        k
        for k in list_kernels(mode=mode)
        if (k.function in functions if functions else (bool(only) or k.kind != ATTENTION))
        and (not backends or k.backend in backends)
        and (k.name in only if only else not k.baseline)
    ]
