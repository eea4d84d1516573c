"""The one kernel registry: built-in kernels and the ones users bring in kernel files.

    from elasticbench import register_kernel

    @register_kernel(function="elastic", backend="numpy", name="my_elastic")
    def my_elastic(x, *, tau, beta): ...
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .backends import get_backend
from .functions import get_function
from .numerics.dtypes import get_format

MODES = ("fwd", "bwd")
BUILTIN_MODULES = (
    "elasticbench.kernels.numpy_kernels",
    "elasticbench.kernels.torch_kernels",
    "elasticbench.kernels.triton_kernels",
    "elasticbench.kernels.torch_variants",
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

    def supports(self, dtype: str) -> bool:
        """Whether the kernel takes inputs of this format (others are skipped, not failed)."""
        return self.dtypes is None or dtype in self.dtypes

    def takes_layout(self, layout: str) -> bool:
        """Whether its backend's kernels must accept inputs in this layout (inputs/layouts.py)."""
        return layout in get_backend(self.backend).layouts

    def __reduce__(self):  # type: ignore[override]
        # A registered kernel travels to another process by name and is looked up (its
        # kernel file loaded) there: functions of a user's file do not pickle by reference.
        if _KERNELS.get((self.name, self.mode)) is self:
            return (_resolve, (self.name, self.mode, self.source))
        return super().__reduce__()


class KernelFileError(Exception):
    """A kernel file could not be loaded; the message names the file and line."""


_KERNELS: dict[tuple[str, str], KernelSpec] = {}
_builtins_loaded = False
_loading_source = "builtin"


def register_kernel(
    *,
    function: str,
    backend: str,
    name: str | None = None,
    mode: str = "fwd",
    description: str = "",
    baseline: bool = False,
    dtypes: Iterable[str] | None = None,
) -> Callable[[Callable], Callable]:
    """Decorator: register fn as the kernel `name` (default: the function's __name__).

    baseline=True marks a vendor reference point (torch.softmax, say): `run` compares
    against it, and `verify` checks it only when it is named with --only. dtypes limits the
    formats the kernel is given (fp64 for a GPU kernel, say); by default all four.
    """
    get_function(function)
    get_backend(backend)
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
    if mode == "bwd" and get_function(function).gradient_row is None:
        raise ValueError(f"{function} has no gradient, so it takes no backward kernel")
    formats = None if dtypes is None else tuple(get_format(d).name for d in dtypes)

    def deco(fn: Callable) -> Callable:
        kname = name or fn.__name__
        summary = description or (fn.__doc__ or "").strip().partition("\n")[0]
        spec = KernelSpec(kname, function, backend, fn, mode, _loading_source, summary, baseline,
                          formats)
        old = _KERNELS.get((kname, mode))
        if old is not None and old.source != spec.source:
            raise ValueError(
                f"kernel {kname!r} ({mode}) is already registered by {old.source}"
            )
        _KERNELS[(kname, mode)] = spec
        return fn

    return deco


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


def _resolve(name: str, mode: str, source: str) -> KernelSpec:
    """The registered kernel (name, mode), loading its kernel file first if need be."""
    _load_builtins()
    if (name, mode) not in _KERNELS and source != "builtin":
        load_kernel_file(source)
    return get_kernel(name, mode)


def list_kernels(
    function: str | None = None, backend: str | None = None, mode: str | None = None
) -> list[KernelSpec]:
    """Registered kernels (built-ins included), optionally filtered, in registration order."""
    _load_builtins()
    return [
        k
        for k in _KERNELS.values()
        if (function is None or k.function == function)
        and (backend is None or k.backend == backend)
        and (mode is None or k.mode == mode)
    ]


def get_kernel(name: str, mode: str = "fwd") -> KernelSpec:
    _load_builtins()
    try:
        return _KERNELS[(name, mode)]
    except KeyError:
        known = ", ".join(sorted(k for k, m in _KERNELS if m == mode))
        skipped = [f"the {b} built-ins ({why})" for b in _builtin_backends()
                   if (why := get_backend(b).unavailable())]
        note = f"; not loaded: {'; '.join(skipped)}" if skipped else ""
        raise ValueError(f"unknown kernel {name!r} (registered: {known}){note}") from None


def load_kernel_file(path: str | Path) -> list[KernelSpec]:
    """Import a user's kernel file; return the kernels it registered.

    Any failure becomes a KernelFileError naming the file and the line at fault.
    """
    global _loading_source
    _load_builtins()
    p = Path(path)
    if not p.is_file():
        raise KernelFileError(f"kernel file {p} does not exist")
    module_name = f"elasticbench_user_{abs(hash(str(p.resolve())))}"
    _loading_source = str(p)
    try:
        spec = importlib.util.spec_from_file_location(module_name, p)
        if spec is None or spec.loader is None:
            raise KernelFileError(f"kernel file {p} cannot be imported")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except KernelFileError:
        raise
    except SyntaxError as e:
        raise KernelFileError(f"{p}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # any error raised while importing the user's file
        raise KernelFileError(f"{_where(e, p)}: {type(e).__name__}: {e}") from None
    finally:
        _loading_source = "builtin"
    return [k for k in _KERNELS.values() if k.source == str(p)]


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
    which are chosen by name only). Names are checked."""
    functions, backends, only = list(functions), list(backends), list(only)
    for f in functions:
        get_function(f)
    for b in backends:
        get_backend(b)
    for name in only:
        get_kernel(name, mode)
    return [
        k
        for k in list_kernels(mode=mode)
        if (not functions or k.function in functions)
        and (not backends or k.backend in backends)
        and (k.name in only if only else not k.baseline)
    ]
