"""Compile the Triton kernels of kernel files for NVIDIA GPUs (sm_90, sm_80), without one.

Under TRITON_INTERPRET=1 a kernel runs as Python, which accepts code the compiler rejects (a
global that is not a `tl.constexpr`, say): a kernel can pass verification and then fail to
compile on the GPU it was written for. `check_call` drives a registered wrapper with CPU
tensors of a case's dtype and shape, records the launches it makes (`capture`), compiles each
launch once per specialization and arch and reports registers and spills, or the compiler's
message. Results are cached on disk by everything that determines the compilation.

Compiling needs Triton's JIT, not its interpreter, so `check_calls` runs this module in a
child process without TRITON_INTERPRET (`python -m elasticbench.harness.audit.kernel_files`: JSON
requests on stdin, JSON results on stdout).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from elasticbench.devices import interpreter_env

ARCHS = (90, 80)
VERSION = 2  # of the cached results' meaning


@dataclass(frozen=True)
class CallRequest:
    """One call of a registered kernel to compile: a verify case's kernel, dtype and shape."""

    kernel: str
    mode: str
    dtype: str
    shape: tuple[int, int]
    params: dict[str, float] = field(default_factory=dict)


@dataclass
class Compiled:
    """What the compiler made of one launch for one arch: registers and spills, or an error."""

    launch: str  # the jit function's name
    arch: int
    regs: int | None = None
    spill_bytes: int | None = None  # stack and local memory per thread: register spills
    error: str | None = None  # the compiler's message

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class CallCheck:
    """The launches of one call, compiled; `error` when the wrapper could not be driven on CPU
    tensors (then nothing is known about compiling, which is not a failure)."""

    launches: list[Compiled]
    error: str | None = None

    @property
    def compiles(self) -> bool | None:
        return None if self.error else all(c.ok for c in self.launches)

    def to_dict(self) -> dict[str, Any]:
        """The record's `compile` field."""
        return {"compiles": self.compiles, "error": self.error,
                "launches": [asdict(c) for c in self.launches]}

    def failure(self) -> str | None:
        """One line naming the first launch that does not compile and why, or None."""
        bad = next((c for c in self.launches if not c.ok), None)
        return None if bad is None else f"does not compile for sm_{bad.arch}: {bad.error}"


def compiler_message(exc: BaseException, kernel: Any) -> str:
    """The compiler's complaint in one line, at file:line of the kernel's source when the
    front end names a line (its own text is the whole kernel with a caret)."""
    import inspect

    node, message = getattr(exc, "node", None), getattr(exc, "error_message", None)
    if node is None or message is None or not hasattr(node, "lineno"):
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[-1] if text else ''}".rstrip(": ")
    lines, first = inspect.getsourcelines(kernel.fn)
    def_line = first + next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("def "))
    path = Path(kernel.fn.__code__.co_filename)
    if path.is_relative_to(Path.cwd()):
        path = path.relative_to(Path.cwd())
    return f"{path}:{def_line + node.lineno - 1}: {message}"


def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
            "fp64": torch.float64}[name]


def _drive(fn: Any, req: CallRequest) -> list[Any]:
    """The launches fn makes for req, from CPU tensors of its dtype and shape (never run)."""
    import torch

    from elasticbench.harness.audit.capture import capture_launches

    x = torch.zeros(req.shape, dtype=_torch_dtype(req.dtype))
    args = (x,) if req.mode == "fwd" else (x, torch.zeros_like(x), torch.zeros_like(x))
    with capture_launches() as launches:
        fn(*args, **req.params)
    return launches


class CompileCache:
    """Compile results by specialization: in memory, and as JSON files under `root`."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.memory: dict[str, dict] = {}
        self.compiled = 0  # compilations actually run (the rest were cache hits)

    def get(self, key: str) -> dict | None:
        if key not in self.memory and self.root is not None:
            path = self.root / f"{key}.json"
            if path.is_file():
                self.memory[key] = json.loads(path.read_text())
        return self.memory.get(key)

    def put(self, key: str, value: dict) -> None:
        self.memory[key] = value
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f"{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(value))
            tmp.replace(self.root / f"{key}.json")


def _specialization_key(launch: Any, arch: int) -> str:
    """A hash of everything that decides what the compiler is given: the kernel's source and
    its callees (Triton's cache_key), the arguments' types and alignment, the constexprs,
    the options, the arch and Triton's version."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = launch.kernel
    backend = make_backend(GPUTarget("cuda", arch, 32))
    bind = create_function_from_signature(kernel.signature, kernel.params, backend)
    _bound, specialization, options = bind(*launch.args, **launch.kwargs)
    parts = (VERSION, triton.__version__, arch, kernel.cache_key, repr(specialization),
             repr(sorted(options.items()) if isinstance(options, dict) else options),
             repr(sorted((k, repr(v)) for k, v in launch.kwargs.items())))
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def compile_one(launch: Any, arch: int, cache: CompileCache) -> Compiled:
    """Compile launch for sm_arch (from the cache when this specialization was compiled)."""
    from elasticbench.harness.audit.compile import compile_launch, resource_usage

    key = _specialization_key(launch, arch)
    hit = cache.get(key)
    if hit is not None:
        return Compiled(**hit)
    cache.compiled += 1
    try:
        compiled = compile_launch(launch, arch)
    except Exception as e:  # the compiler rejected the kernel: that is the result
        result = Compiled(launch.name, arch, error=compiler_message(e, launch.kernel))
    else:
        result = Compiled(launch.name, arch, *resource_usage(compiled.asm["cubin"]))
    cache.put(key, asdict(result))
    return result


def check_call(fn: Any, req: CallRequest, cache: CompileCache,
               archs: tuple[int, ...] = ARCHS) -> CallCheck:
    """Compile every launch fn makes for req, for each arch."""
    try:
        launches = _drive(fn, req)
    except Exception as e:  # the wrapper needs a GPU, say: nothing to compile from
        return CallCheck([], f"could not be driven on CPU tensors: {type(e).__name__}: {e}")
    if not launches:
        return CallCheck([], "launched no Triton kernel")
    return CallCheck([compile_one(launch, arch, cache) for launch in launches for arch in archs])


def _cache_root() -> Path:
    from elasticbench.harness.numerics.truth.cache import default_cache_dir

    return default_cache_dir() / "triton-compile"


def check_calls(kernel_files: list[str], requests: list[CallRequest],
                archs: tuple[int, ...] = ARCHS, timeout: float = 600) -> list[CallCheck]:
    """check_call for each request, in a child process where Triton compiles (no
    interpreter). The kernels are looked up by name after loading kernel_files."""
    payload = {"kernel_files": kernel_files, "archs": list(archs),
               "requests": [asdict(r) for r in requests]}
    run = subprocess.run([sys.executable, "-m", "elasticbench.harness.audit.kernel_files"],
                         input=json.dumps(payload), capture_output=True, text=True,
                         env=interpreter_env(on=False), timeout=timeout)
    if run.returncode != 0:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the compile check failed: {tail}")
    return [CallCheck([Compiled(**c) for c in r["launches"]], r["error"])
            for r in json.loads(run.stdout)]


def _main() -> None:
    from elasticbench.harness.registry import get_kernel, load_kernel_file

    payload = json.loads(sys.stdin.read())
    for path in payload["kernel_files"]:
        load_kernel_file(path)
    cache = CompileCache(_cache_root())
    archs = tuple(payload["archs"])
    out = []
    for raw in payload["requests"]:
        req = CallRequest(raw["kernel"], raw["mode"], raw["dtype"], tuple(raw["shape"]),
                          raw["params"])
        check = check_call(get_kernel(req.kernel, req.mode).fn, req, cache, archs)
        out.append({"launches": [asdict(c) for c in check.launches], "error": check.error})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    _main()
