"""The one kernel registry: built-in kernels and the ones users bring in kernel files.

    from elasticbench import register_kernel

    @register_kernel(function="elastic", backend="numpy", name="my_elastic")
    def my_elastic(x, *, tau, beta): ...

Row kernels take one array of rows; attention kernels (function elastic_attention or
softmax_attention) take q, k, v: their contract is docs/attention.md section 4. Both kinds
share this registry; a kernel's `kind` says which it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .backends import get_backend
from .functions import ATTENTION, ROW, function_kind, get_function
from .numerics.contract import WIDE, check_accuracy
from .numerics.dtypes import get_format
from .passes import PassModel

MODES = ("fwd", "bwd")
BUILTIN_MODULES = (
    "elasticbench.kernels.numpy_kernels",
    "elasticbench.kernels.torch_kernels",
    "elasticbench.kernels.triton_kernels",
    "elasticbench.kernels.triton_attention",
    "elasticbench.kernels.torch_variants",
    "elasticbench.kernels.torch_attention",
    "elasticbench.kernels.cpp_kernels",
    "elasticbench.kernels.cpp_attention",
)


@dataclass(frozen=True)
class KernelSpec:
    """A registered kernel: what it computes, on which backend, and the callable."""

    name: str
    function: str
    backend: str
    fn: Callable
    mode: str = "fwd"
    source: str = "builtin"
    description: str = ""
    baseline: bool = False  # a vendor reference point: timed by run, verified only by name
    dtypes: tuple[str, ...] | None = None  # formats it accepts; None: all of them
    model: PassModel | None = None  # its declared passes; None: its function's minimum
    accuracy: str = WIDE  # the contract its budgets come from (numerics/contract.py)
    compiles: bool = False  # compiles code per input shape (Backend.compiles)

    @property
    def kind(self) -> str:
        """"row" (fn(x, **params)) or "attention" (fn(q, k, v, ...), docs/attention.md)."""
        return function_kind(self.function)

    def supports(self, dtype: str) -> bool:
        """Whether the kernel takes inputs of this format (others are skipped, not failed)."""
        return self.dtypes is None or dtype in self.dtypes

    def takes_layout(self, layout: str) -> bool:
        """Whether its backend's kernels must accept inputs in this layout (inputs/layouts.py)."""
        return layout in get_backend(self.backend).layouts

    def __reduce__(self):  # type: ignore[override]
        # A registered kernel travels to another process by name and is looked up (its
        # kernel file loaded) there: functions of a user's file do not pickle by reference.
        if _REGISTRY.get(self.name, self.mode) is self:
            return (_resolve, (self.name, self.mode, self.source))
        return super().__reduce__()


class KernelFileError(Exception):
    """A kernel file could not be loaded; the message names the file and line."""


class KernelRegistry:
    """Kernels by (name, mode), in registration order; `scoped` undoes what a block adds."""

    def __init__(self) -> None:
        self._kernels: dict[tuple[str, str], KernelSpec] = {}

    def get(self, name: str, mode: str) -> KernelSpec | None:
        return self._kernels.get((name, mode))

    def add(self, spec: KernelSpec) -> None:
        self._kernels[(spec.name, spec.mode)] = spec

    def specs(self) -> list[KernelSpec]:
        return list(self._kernels.values())

    @contextmanager
    def scoped(self, *, alone: bool = False) -> Iterator[None]:
        """Kernels registered inside the block are forgotten after it; alone=True also hides
        the ones registered before, for the block's duration."""
        saved = dict(self._kernels)
        if alone:
            self._kernels.clear()
        try:
            yield
        finally:
            self._kernels.clear()
            self._kernels.update(saved)


_REGISTRY = KernelRegistry()
_builtins_loaded = False
_loading_source = "builtin"
_loaded_keys: list[tuple[str, str]] | None = None  # what the file being loaded registers


def register_kernel(
    *,
    function: str,
    backend: str,
    name: str | None = None,
    mode: str = "fwd",
    description: str = "",
    baseline: bool = False,
    dtypes: Iterable[str] | None = None,
    model: PassModel | None = None,
    accuracy: str = WIDE,
    compiles: bool | None = None,
) -> Callable[[Callable], Callable]:
    """Decorator: register fn as the kernel `name` (default: the function's __name__).

    baseline=True marks a vendor reference point (torch.softmax, say): `run` compares
    against it, and `verify` checks it only when it is named with --only. dtypes limits the
    formats the kernel is given (fp64 for a GPU kernel, say); by default all four. model
    declares its passes over memory and its exponentials (elasticbench.passes), which give
    it its own roof in `run`. accuracy names the contract its budgets come from: "wide" (a
    16-bit kernel computes in fp32 and rounds once, the default) or "own" (every step rounds
    to its own format; row kernels only), numerics/contract.py. compiles says whether it
    compiles code for each input shape it meets (torch.compile, a JIT); by default, what its
    backend's kernels may do (Backend.compiles).
    """
    kind = function_kind(function)
    check_accuracy(accuracy)
    if accuracy != WIDE and kind == ATTENTION:
        raise ValueError(f"attention kernels are judged by the {WIDE!r} contract only, "
                         f"got accuracy={accuracy!r}")
    per_shape = get_backend(backend).compiles if compiles is None else compiles
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
    if kind == ROW and mode == "bwd" and get_function(function).gradient_row is None:
        raise ValueError(f"{function} has no gradient, so it takes no backward kernel")
    formats = None if dtypes is None else tuple(get_format(d).name for d in dtypes)

    def deco(fn: Callable) -> Callable:
        kname = name or fn.__name__
        summary = description or (fn.__doc__ or "").strip().partition("\n")[0]
        spec = KernelSpec(kname, function, backend, fn, mode, _loading_source, summary, baseline,
                          formats, model, accuracy, per_shape)
        old = _REGISTRY.get(kname, mode)
        if _loaded_keys is not None:
            _loaded_keys.append((kname, mode))
        if old is not None and old.source != spec.source:
            if _same_definition(old.fn, fn):  # a module imported by two kernel files
                return fn
            raise ValueError(
                f"kernel {kname!r} ({mode}) is already registered by {old.source}"
            )
        _REGISTRY.add(spec)
        return fn

    return deco


def _same_definition(a: Callable, b: Callable) -> bool:
    """Whether two functions come from the same lines of the same file (one module executed
    twice, under two names)."""
    ca, cb = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (ca is not None and cb is not None and ca.co_filename == cb.co_filename
            and ca.co_firstlineno == cb.co_firstlineno)


def _backend_of(module: str) -> str:
    return module.rsplit(".", 1)[-1].partition("_")[0]  # <backend>_<anything>


def _builtin_backends() -> list[str]:
    return list(dict.fromkeys(_backend_of(m) for m in BUILTIN_MODULES))


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for module in BUILTIN_MODULES:
        if get_backend(_backend_of(module)).available():
            importlib.import_module(module)


@contextmanager
def scoped_kernels(*, alone: bool = False) -> Iterator[None]:
    """Kernels registered inside the block (kernel files loaded in it) are forgotten after
    it; the built-ins are loaded first, so they stay. alone=True hides every kernel
    registered before the block while it runs (see KernelRegistry.scoped)."""
    _load_builtins()
    with _REGISTRY.scoped(alone=alone):
        yield


def _resolve(name: str, mode: str, source: str) -> KernelSpec:
    """The registered kernel (name, mode), loading its kernel file first if need be."""
    _load_builtins()
    if _REGISTRY.get(name, mode) is None and source != "builtin":
        load_kernel_file(source)
    return get_kernel(name, mode)


def list_kernels(
    function: str | None = None, backend: str | None = None, mode: str | None = None
) -> list[KernelSpec]:
    """Registered kernels (built-ins included), optionally filtered, in registration order."""
    _load_builtins()
    return [
        k
        for k in _REGISTRY.specs()
        if (function is None or k.function == function)
        and (backend is None or k.backend == backend)
        and (mode is None or k.mode == mode)
    ]


def get_kernel(name: str, mode: str = "fwd") -> KernelSpec:
    _load_builtins()
    spec = _REGISTRY.get(name, mode)
    if spec is None:
        known = ", ".join(sorted(k.name for k in _REGISTRY.specs() if k.mode == mode))
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
    global _loading_source, _loaded_keys
    _load_builtins()
    p = Path(path)
    if not p.is_file():
        raise KernelFileError(f"kernel file {p} does not exist")
    directory = str(p.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module_name = f"elasticbench_user_{abs(hash(str(p.resolve())))}"
    _loading_source = str(p)
    keys: list[tuple[str, str]] = []
    _loaded_keys = keys
    aliases = [module_name] + ([p.stem] if _importable_as(p.stem, p) else [])
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
    finally:
        _loading_source, _loaded_keys = "builtin", None
    return [spec for k in dict.fromkeys(keys) if (spec := _REGISTRY.get(*k)) is not None]


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
