"""Compile a Triton kernel launch for an NVIDIA GPU this machine need not have, and read it back.

Triton compiles for a CUDA target without a GPU: the launch is specialized as the JIT would
specialize it on the device (argument alignment and divisibility) and compiled with the
bundled ptxas; the bundled cuobjdump reads registers, spills and SASS back from the cubin.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from elasticbench.harness.audit.capture import Launch


def compile_launch(launch: Launch, arch: int) -> Any:
    """Compile a captured launch as the JIT would for sm_`arch` (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import create_function_from_signature

    kernel = launch.kernel
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    bind = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = bind(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = _pack_args(kernel, backend, launch.kwargs, bound,
                                                       specialization, options)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton_compile(source, target=target, options=options.__dict__)


def _pack_args(kernel: Any, backend: Any, kwargs: dict[str, Any], bound: dict[str, Any],
               specialization: list, options: Any) -> tuple[Any, dict, dict, dict]:
    """(options, signature, constexprs, attrs) the JIT compiles a launch with: the JIT's own
    `_pack_args` where it has one, else the same steps, which older JITs (Triton 3.4) take
    inline in `run`."""
    pack = getattr(kernel, "_pack_args", None)
    if pack is not None:
        return pack(backend, kwargs, bound, specialization, options)
    from triton._utils import find_paths_if, get_iterable_path

    options = backend.parse_options(kwargs)
    sigvals = [x[0] for x in specialization]
    signature = dict(zip((p.name for p in kernel.params), sigvals, strict=True))
    constexprs = {path: get_iterable_path(list(bound.values()), path)
                  for path in find_paths_if(sigvals, lambda _, v: v == "constexpr")}
    attrvals = ["" if x[0] == "constexpr" else x[1] for x in specialization]
    attrs = {path: backend.parse_attr(get_iterable_path(attrvals, path))
             for path in find_paths_if(attrvals, lambda _, v: isinstance(v, str))}
    return options, signature, constexprs, attrs


_SASS = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")
_RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def opcode_width(opcode: str) -> int:
    """Bits per thread of an LDG/STG opcode (LDG.E.128 -> 128, LDG.E.U16 -> 16, LDG.E -> 32)."""
    for part in opcode.split(".")[1:]:
        digits = part.lstrip("US")
        if digits.isdigit():
            return int(digits)
    return 32


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([knobs.nvidia.cuobjdump.path, *flags, str(path)],
                              capture_output=True, text=True, check=True).stdout


def _resources(text: str) -> tuple[int, int]:
    found = _RES.search(text)
    if not found:
        raise RuntimeError("cuobjdump printed no resource usage")
    regs, stack, _shared, local = (int(v) for v in found.groups())
    return regs, stack + local


def resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, stack + local bytes per thread) of the cubin's kernel; Triton inlines every
    call, so local bytes are register spills (milliseconds: no disassembly)."""
    return _resources(_cuobjdump(cubin, "-res-usage"))


def read_cubin(cubin: bytes) -> tuple[int, int, list[str]]:
    """(registers, stack + local bytes per thread, SASS opcodes in order without NOPs), from
    one cuobjdump of the cubin (a disassembly: a few tenths of a second)."""
    text = _cuobjdump(cubin, "-res-usage", "-sass")
    return (*_resources(text), [op for op in _SASS.findall(text) if op != "NOP"])
