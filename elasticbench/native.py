"""Build and load the native C++ code of kernels/cpp through torch's extension API.

Two extensions, each built apart from the other:

- the library's (`LIBRARY`): the kernels elasticbench.functional and elasticbench.nn run on
  CPU tensors, loaded by `load()`;
- the harness's (`REFERENCE`): the exact reference's certified gradient sweeps
  (reference_grad.cpp), which verify's and hunt's reference processes use where it is built
  (`built()`); the library never loads it (docs/dispatch.md section 1).

Each is compiled on first use (JIT, `torch.utils.cpp_extension.load`) into a build
directory keyed by a hash of its sources (the headers included), the flags, the compiler,
torch's and Python's versions, so an edited source or a new torch never loads a stale
binary, and a machine without a compiler still installs and runs everything else
(docs/native.md section 4 says why JIT).

    python -m elasticbench.native    # build both now; print the instruction set, or why not
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .settings import settings

# -fopenmp: at::parallel_for is a header template whose OpenMP pragma is compiled into the
# extension; without the flag it runs every range on the calling thread. -fvisibility=hidden:
# only the module's init is exported, so no call between the kernels goes through the PLT.
FLAGS = ("-O3", "-std=c++17", "-fno-math-errno", "-fno-trapping-math", "-fopenmp",
         "-fvisibility=hidden")
X86_SOURCES = ("isa_avx2.cpp", "isa_avx512.cpp", "attention_isa_avx2.cpp",
               "attention_isa_avx512.cpp")


class NativeBuildError(RuntimeError):
    """The project's own C++ sources did not compile; the message holds the compiler's log."""


@dataclass(frozen=True)
class Extension:
    """One extension built from kernels/cpp: the stem of its module's name, its translation
    units, and those added on x86 (the instruction-set files)."""

    stem: str
    units: tuple[str, ...]
    x86_units: tuple[str, ...] = ()


LIBRARY = Extension("elasticbench_cpp", ("ops.cpp", "cpu.cpp", "isa_generic.cpp",
                                         "attention.cpp", "attention_isa_generic.cpp"),
                    X86_SOURCES)
REFERENCE = Extension("elasticbench_reference", ("reference_grad.cpp",))
EXTENSIONS = (LIBRARY, REFERENCE)


def source_dir() -> Path:
    from . import kernels

    return Path(kernels.__file__).parent / "cpp"


def sources(ext: Extension = LIBRARY) -> list[Path]:
    """The translation units `ext` compiles on this machine."""
    names = list(ext.units)
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "i386"):
        names += ext.x86_units
    return [source_dir() / n for n in names]


def _keyed_files(ext: Extension) -> list[Path]:
    """The files whose bytes decide ext's binary: every header, and every .cpp but those
    another extension compiles (so editing the reference never rebuilds the library)."""
    others = {n for e in EXTENSIONS if e != ext for n in (*e.units, *e.x86_units)}
    return [p for p in sorted(source_dir().iterdir())
            if p.suffix == ".h" or (p.suffix == ".cpp" and p.name not in others)]


def compiler() -> str | None:
    """The C++ compiler torch would use ($CXX, else c++), if it is on the PATH."""
    return shutil.which(os.environ.get("CXX", "c++"))


def build_root() -> Path:
    """$ELASTICBENCH_BUILD_DIR (elasticbench.settings), else $XDG_CACHE_HOME/elasticbench/cpp,
    else ~/.cache/..."""
    if (chosen := settings().build_dir) is not None:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "elasticbench" / "cpp"


def build_key(ext: Extension = LIBRARY) -> str:
    """Hash of everything that decides ext's binary (its sources, the headers, flags,
    toolchain) and of where the sources are."""
    import torch

    h = hashlib.sha256(ext.stem.encode())
    for path in _keyed_files(ext):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    # the checkout's own path too: torch writes absolute source paths into the build
    # directory's ninja file, so two checkouts sharing one directory rebuild each other's
    for part in (*FLAGS, torch.__version__, sys.version, platform.machine(), str(compiler()),
                 str(source_dir().resolve())):
        h.update(part.encode())
    return h.hexdigest()[:16]


def missing_tools() -> str | None:
    """Why no build can be tried here, in one line; None when the tools are present."""
    try:
        import torch.utils.cpp_extension  # noqa: F401
    except ImportError:
        return "torch is not installed"
    if compiler() is None:
        return f"no C++ compiler ({os.environ.get('CXX', 'c++')} is not on the PATH)"
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    return None


def _library(ext: Extension = LIBRARY) -> tuple[Path, str]:
    """The build directory and module name of ext for these sources (build_key)."""
    key = build_key(ext)
    return build_root() / key, f"{ext.stem}_{key}"


@functools.lru_cache(maxsize=1)
def load() -> ModuleType:
    """The library's extension (the kernels elasticbench.functional runs), built first if
    need be. NativeBuildError if it does not build."""
    return _load(LIBRARY)


@functools.lru_cache(maxsize=1)
def load_reference() -> ModuleType:
    """The harness's extension (the reference's certified gradient sweeps), built first if
    need be. NativeBuildError if it does not build."""
    return _load(REFERENCE)


def _load(ext: Extension) -> ModuleType:
    """ext, imported from its build directory, compiled there first where it is not built."""
    if why := missing_tools():
        raise NativeBuildError(why)
    from torch.utils.cpp_extension import load as load_extension

    directory, name = _library(ext)
    directory.mkdir(parents=True, exist_ok=True)
    with _build_lock(directory):
        if (built := _import_built(directory, name)) is not None:
            return built
        try:
            return load_extension(
                name=name,
                sources=[str(s) for s in sources(ext)],
                extra_cflags=list(FLAGS),
                extra_ldflags=["-fopenmp"],
                extra_include_paths=[str(source_dir())],
                build_directory=str(directory),
                verbose=False,
            )
        except (RuntimeError, OSError, ImportError) as e:
            raise NativeBuildError(_first_error(str(e)) + f" (build directory {directory})") from e


@functools.lru_cache(maxsize=1)
def built() -> ModuleType | None:
    """The harness's extension (REFERENCE) where it is built already for these sources
    (imported, never compiled: the fast reference uses it where it is there,
    numerics/certified/native_sweeps.py), else None. `make native` builds it."""
    try:
        directory, name = _library(REFERENCE)
    except (ImportError, OSError):  # no torch, or no sources to key a build on
        return None
    if (loaded := sys.modules.get(name)) is not None:
        return loaded
    if not (directory / f"{name}.so").is_file():
        return None
    with _build_lock(directory):
        return _import_built(directory, name)


def _import_built(directory: Path, name: str) -> ModuleType | None:
    """The library already built in this key's directory, imported without asking ninja.

    The key covers everything the binary depends on, so a library there is current; going
    through ninja instead rebuilt it whenever another process had rewritten the directory's
    ninja file. A library that does not import (a link killed halfway) is removed and rebuilt.
    """
    library = directory / f"{name}.so"
    if not library.is_file():
        return None
    if (loaded := sys.modules.get(name)) is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError:
        library.unlink(missing_ok=True)
        return None
    sys.modules[name] = module
    return module


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Hold an flock on the build directory, which the kernel releases when its holder dies.

    torch's own lock is a file that a build killed halfway (a timeout, Ctrl-C) leaves behind,
    after which every later load waits for it forever. Every load here takes this lock
    first, so a torch lock file found while holding it was left by a dead process: remove it.
    """
    with open(directory / "elasticbench.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _first_error(log: str) -> str:
    """The compiler's first error line, else the message's first line."""
    lines = log.splitlines()
    for line in lines:
        if ": error:" in line or ": fatal error:" in line:
            return line.strip()
    return lines[0].strip() if log.strip() else "the build failed"


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why the native kernels cannot run here, in one line; None when they can."""
    try:
        load()
    except NativeBuildError as e:
        return f"the C++ kernels are not built: {e}"
    return None


def main() -> int:
    """Build both extensions now (make test and make run call this): 0 built or no compiler,
    1 a build error."""
    if why := missing_tools():
        print(f"elasticbench native kernels: skipped, {why}")
        return 0
    # the reference's one unit compiles in a process of its own beside the library's units,
    # which leave a core idle at their end: built one after the other, it added its 40-odd
    # seconds to every fresh build on 2 cores
    beside = subprocess.Popen([sys.executable, "-c",
                               "from elasticbench import native; native.load_reference()"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ext = load()
        print(f"elasticbench native kernels: built for {ext.isa()} "
              f"(available: {', '.join(ext.isas())}) in {build_root() / build_key()}")
        beside.wait()
        load_reference()  # loads what the process built; builds it, with its errors, if not
        print(f"elasticbench reference sweeps: built in {build_root() / build_key(REFERENCE)}")
    except NativeBuildError as e:
        beside.wait()
        print(f"elasticbench native code: BUILD FAILED: {e}", file=sys.stderr)
        cause = e.__cause__
        if cause is not None:
            print(str(cause), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
