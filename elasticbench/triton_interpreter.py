"""Exact bf16 for any Triton kernel run by Triton's CPU interpreter (TRITON_INTERPRET=1).

NumPy has no bf16, so the interpreter (triton/runtime/interpreter.py) keeps bf16 tensors as
their uint16 bit patterns and then treats those bits as numbers: `a + b` adds the bit
patterns as integers, `tl.sum` and `tl.max` reduce them as integers (every negative value
is larger than every positive one), `abs` and bitcasts are fine, and its bf16 <-> fp32
conversion truncates (an explicit `.to(tl.bfloat16)` rounds toward zero; with a rounding mode
it rounds half away from zero without a sticky bit, and mangles subnormals). A bf16 kernel that
is right on a GPU is garbage there.

`exact_bf16()` makes the interpreter hold bf16 tensors as float32 arrays whose values are bf16
numbers, converting only where memory is touched (loads, stores, atomics, bitcasts), and rounds
every bf16 result once to nearest-even, as the GPU does:

- elementwise arithmetic, comparisons, min/max, math functions: computed in fp32 and rounded
  to bf16 (for +, -, *, / and sqrt fp32 carries more than 2 x 8 + 2 bits, so rounding twice
  gives the correctly rounded bf16 result);
- conversions: bf16 -> wider is exact; fp32 -> bf16 rounds to nearest even (or toward zero when
  asked); fp64 -> bf16 rounds once (via round-to-odd fp32); NaN stays NaN, overflow goes to inf;
- fma: exact product and sum in fp64, rounded to bf16 once;
- `tl.sum` / `tl.cumsum` / `tl.cumprod` of bf16: every addition (multiplication) rounded to bf16,
  in a pairwise order for sums and left to right for scans. A GPU also rounds every step, in an
  order set by the layout, so the error is of the same kind but not bit-identical;
- atomics on bf16 memory are done as load, operate, round, store (the interpreter runs programs
  one at a time, so nothing interleaves; `cooperative_grid` below runs atomics one at a time).

One fix is not about bf16: `tl.maximum` / `tl.minimum` (maxnum and minnum, which drop a NaN on
a GPU) propagate NaN in the interpreters of Triton 3.4 to 3.6; within the block they drop it,
in every dtype, as later interpreters do. Nor is one change about results: within a launch,
a call of a jit helper no longer patches triton.language again (the launch did), which
takes about half of an interpreted kernel's time.

The patch finds what it replaces by feature, not by version, and works on every Triton from
3.4 on: load and store hints are passed on in whatever number they come, and where
`TensorHandle` has no `__post_init__` (3.4) its `__init__` is wrapped instead, and a tensor
used as an index (`tl.range(tl.program_id(0), ...)`) is read with `.item()`, which the older
interpreters' `int(data)` fails under NumPy 2 for one-element arrays. It is applied
for the duration of the block and then undone; it changes nothing else for other dtypes, nor
on a GPU (where the interpreter is not used).

`cooperative_grid()` is the other patch: the interpreter runs a grid's programs one after
another, so a kernel whose programs wait for each other (a barrier through atomics, which a
GPU's cooperative launch makes safe) would spin for ever on the first. Within the block, a
launch that asks for a cooperative grid (`launch_cooperative_grid=True`) runs all its programs
at once, one Python thread each with its own program id, so the kernel's own barrier code is
what runs; a launch in which no program changes memory for `timeout_s` (every program waiting:
a GPU would hang) stops every program and fails with `CooperativeDeadlock`. A program that
executes the resident barrier's `trap` (inline assembly the interpreter cannot run;
kernels/triton/row_parts.py, arrive_and_wait, after its bounded wait) fails the launch with
`BarrierTrap`, as the trap fails it on a GPU.

Nothing in the library imports this module unless TRITON_INTERPRET=1 (kernels/triton/launch.py
imports it at its first interpreted launch).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

U16, U32 = np.uint16, np.uint32


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """float32 array of the bf16 numbers whose bit patterns are given (16-bit integers)."""
    return (np.asarray(bits).view(U16).astype(U32) << U32(16)).view(np.float32)


def _f64_to_f32_odd(x: np.ndarray) -> np.ndarray:
    """fp64 -> fp32 rounding to odd: truncate, and set the last bit when inexact. Rounding that
    to bf16 (16 bits shorter) gives the correctly rounded bf16 of x."""
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(np.float32)
        inexact = (y.astype(np.float64) != x) & ~np.isnan(x)
        away = np.abs(y.astype(np.float64)) > np.abs(x)  # RNE went up in magnitude
    bits = y.view(U32).copy()
    bits[inexact & away] -= U32(1)  # one step toward zero (inf becomes the largest finite)
    bits[inexact] |= U32(1)
    return bits.view(np.float32)


def bf16_bits(values: np.ndarray, toward_zero: bool = False) -> np.ndarray:
    """uint16 bit patterns of float values rounded to bf16 (nearest even, or toward zero)."""
    v = np.asarray(values)
    v = _f64_to_f32_odd(v) if v.dtype == np.float64 else v.astype(np.float32)
    u = v.view(U32)
    nan = (u & U32(0x7FFFFFFF)) > U32(0x7F800000)
    # nearest even: add 0x7FFF plus the lowest kept bit, then drop 16 bits
    bias = U32(0) if toward_zero else U32(0x7FFF) + ((u >> U32(16)) & U32(1))
    rounded = (u + bias) >> U32(16)
    quiet = (u >> U32(16)) | U32(0x40)
    return np.where(nan, quiet, rounded).astype(U16)


def round_bf16(values: np.ndarray, toward_zero: bool = False) -> np.ndarray:
    """float32 array of values rounded to bf16."""
    return bf16_values(bf16_bits(values, toward_zero))


def _pairwise_sum(x: np.ndarray, axis: int | None, keepdims: bool) -> np.ndarray:
    """Sum along axis with every addition rounded to bf16, pairwise."""
    a = np.moveaxis(x.reshape(-1) if axis is None else x, -1 if axis is None else axis, -1)
    while a.shape[-1] > 1:
        if a.shape[-1] % 2:
            pad = np.full((*a.shape[:-1], 1), -0.0, dtype=np.float32)  # x + -0.0 == x
            a = np.concatenate([a, pad], axis=-1)
        a = round_bf16(a[..., 0::2] + a[..., 1::2])
    total = a[..., 0] if a.shape[-1] else np.zeros(a.shape[:-1], dtype=np.float32)
    if keepdims:
        total = np.expand_dims(total, tuple(range(x.ndim)) if axis is None else axis)
    return total


def _scan(x: np.ndarray, axis: int, op: Callable[[np.ndarray, np.ndarray], np.ndarray]):
    """Inclusive scan along axis, each step rounded to bf16, left to right."""
    a = np.moveaxis(x, axis, -1).copy()
    for i in range(1, a.shape[-1]):
        a[..., i] = round_bf16(op(a[..., i - 1], a[..., i]))
    return np.moveaxis(a, -1, axis)


class ExactBf16:
    """The interpreter patch: one method per function of Triton's interpreter that it
    replaces, named after that function. Each takes the object the interpreter called it on
    first (a builder, a tensor handle, a reduce or scan op; nothing for `_get_np_dtype`, a
    module function), then that function's own arguments, and hands every dtype but bf16 to
    the original. `install` sets them all; `undo` puts the originals back."""

    BUILDER = ("create_masked_load", "create_masked_store", "cast_impl", "create_fp_to_fp",
               "create_bitcast", "create_fabs", "create_fma", "create_atomic_rmw",
               "create_atomic_cas")
    # tl.maximum/minimum's default lowers to maxnum/minnum, which drop a NaN on a GPU; the
    # interpreters of Triton 3.4 to 3.6 propagate it (np.maximum): set where they exist
    NAN_DROPPING = (("create_maxnumf", np.fmax), ("create_minnumf", np.fmin))

    def __init__(self) -> None:
        self.original: dict[str, Any] = {}  # the replaced functions by name
        self._saved: list[tuple[Any, str, Any]] = []
        self._launch_langs: frozenset[int] | None = None  # what the running launch patched

    def install(self) -> None:
        _import_triton()
        self._set(it, "_get_np_dtype", self._get_np_dtype)
        if "__post_init__" in it.TensorHandle.__dict__:  # it checks the data's width (3.5 on)
            self._set(it.TensorHandle, "__post_init__", _method(self.__post_init__))
        else:  # a dataclass without one (3.4): every handle is made by __init__ alone
            self._set(it.TensorHandle, "__init__", _method(self.handle_init))
        for name in self.BUILDER:
            self._set(it.InterpreterBuilder, name, _method(getattr(self, name)))
        self._set(it, "_patch_lang_tensor", self._patch_lang_tensor)
        if "_patch_lang" in it.__dict__:
            self._set(it, "_patch_lang", self._patch_lang)
        for name, op in self.NAN_DROPPING:
            if name in it.InterpreterBuilder.__dict__:
                self._set(it.InterpreterBuilder, name, _nan_dropping(op))
        self._set(it.ReduceOps, "sum", _method(self.sum))
        self._set(it.ScanOps, "cumsum", _method(self.cumsum))
        self._set(it.ScanOps, "cumprod", _method(self.cumprod))

    def undo(self) -> None:
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()
        self.original.clear()
        self._launch_langs = None

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self.original[name] = owner.__dict__[name]
        self._saved.append((owner, name, self.original[name]))
        setattr(owner, name, value)

    # ---- types and handles --------------------------------------------------------------

    def _get_np_dtype(self, tt_dtype: Any) -> np.dtype:
        if not isinstance(tt_dtype, tl.pointer_type) and _is_bf16(tt_dtype):
            return np.dtype(np.float32)
        return self.original["_get_np_dtype"](tt_dtype)

    def __post_init__(self, handle: Any) -> None:
        # every bf16 handle holds float32 bf16 numbers: bits are decoded, values rounded; a
        # comparison's bool result also arrives typed bf16 (the operands' type) and stays
        if handle.dtype != tl.bfloat16:
            return self.original["__post_init__"](handle)
        _as_bf16_values(handle)

    def handle_init(self, handle: Any, *args: Any, **kwargs: Any) -> None:
        # TensorHandle.__init__ where the class has no __post_init__ (the patch's own
        # __init__ is the patch's constructor, hence the name)
        self.original["__init__"](handle, *args, **kwargs)
        if handle.dtype == tl.bfloat16:
            _as_bf16_values(handle)

    def _patch_lang(self, fn: Any) -> Any:
        # The interpreter patches triton.language at a launch (restored when the grid is
        # done) and again at every call of a jit helper in every program (never restored):
        # each time it walks tl's modules with inspect.getmembers, about half of an
        # interpreted kernel's time, to patch what the launch already patched. A helper whose
        # language modules the running launch patched is left as it is.
        langs = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        if self._launch_langs is not None and langs <= self._launch_langs:
            return _Unpatched()
        scope = self.original["_patch_lang"](fn)
        if self._launch_langs is None and callable(getattr(scope, "restore", None)):
            self._launch_langs = langs  # a launch: until its grid restores the scope
            return _LaunchScope(scope, self)
        return scope

    def _patch_lang_tensor(self, tensor: Any, *scope: Any) -> None:
        # The interpreter makes a tensor an index (tl.range's bounds) with int(data), which
        # NumPy 2 refuses for the one-element 1-D arrays of program_id in Triton 3.4 to 3.6;
        # .item() takes any one-element array (restored with the interpreter's own patches)
        self.original["_patch_lang_tensor"](tensor, *scope)
        tensor.__index__ = lambda t: int(np.asarray(t.handle.data).item())

    # ---- memory -------------------------------------------------------------------------

    # The arguments after `other` (loads) and `mask` (stores) are cache hints whose number
    # differs between Triton versions (cache_modifier and eviction_policy up to 3.6, one
    # cache_policy later), positional from tl.load and by keyword from a tensor descriptor's
    # load: they are passed on as they came, never read.
    def create_masked_load(self, builder, ptrs, mask, other, *hints, **named_hints):
        if not _is_bf16(ptrs.get_element_ty()):
            return self.original["create_masked_load"](builder, ptrs, mask, other, *hints,
                                                       **named_hints)
        other_bits = (np.zeros_like(ptrs.data, dtype=U16) if other is None
                      else np.broadcast_to(bf16_bits(other.data), ptrs.data.shape))
        bits = it._interpreter.load(ptrs.data, mask.data, np.ascontiguousarray(other_bits),
                                    np.dtype(U16))
        return it.TensorHandle(bits, tl.bfloat16)

    def create_masked_store(self, builder, ptrs, value, mask, *hints, **named_hints):
        if not _is_bf16(ptrs.get_element_ty()):
            return self.original["create_masked_store"](builder, ptrs, value, mask, *hints,
                                                        **named_hints)
        bits = np.ascontiguousarray(np.broadcast_to(bf16_bits(value.data), ptrs.data.shape))
        return it._interpreter.store(ptrs.data, bits, mask.data)

    def create_atomic_rmw(self, builder, rmw_op, ptr, val, mask, sem, scope):
        if not _is_bf16(ptr.get_element_ty()):
            return self.original["create_atomic_rmw"](builder, rmw_op, ptr, val, mask, sem,
                                                      scope)
        ops = {it._interpreter.RMW_OP.FADD: np.add, it._interpreter.RMW_OP.MAX: np.maximum,
               it._interpreter.RMW_OP.MIN: np.minimum,
               it._interpreter.RMW_OP.XCHG: lambda old, new: new}
        op = ops.get(builder.ir_rmw_op_to_interpreter_rmw_op.get(rmw_op))
        if op is None:
            raise ValueError(f"atomic {rmw_op} is not defined on bf16")
        # element by element: several lanes may hit the same address
        flat_ptr, flat_val = ptr.data.reshape(-1), np.broadcast_to(val.data, ptr.data.shape)
        flat_val, flat_mask = flat_val.reshape(-1), np.broadcast_to(mask.data, ptr.data.shape)
        old = np.zeros(flat_ptr.shape, dtype=np.float32)
        for i, (p, v, m) in enumerate(zip(flat_ptr, flat_val, flat_mask.reshape(-1),
                                          strict=True)):
            if not m:
                continue
            one = it.TensorHandle(np.array([p], dtype=np.uint64), ptr.dtype)
            on = it.TensorHandle(np.array([True]), tl.int1)
            old[i] = self.create_masked_load(builder, one, on, None).data[0]
            new = it.TensorHandle(np.asarray([op(old[i], v)], dtype=np.float32), tl.bfloat16)
            self.create_masked_store(builder, one, new, on)
        return it.TensorHandle(old.reshape(ptr.data.shape), tl.bfloat16)

    def create_atomic_cas(self, builder, ptr, cmp, val, sem, scope):
        cas = self.original["create_atomic_cas"]
        if not _is_bf16(ptr.get_element_ty()):
            return cas(builder, ptr, cmp, val, sem, scope)
        cmp_bits = it.TensorHandle(bf16_bits(cmp.data), tl.uint16)
        val_bits = it.TensorHandle(bf16_bits(val.data), tl.uint16)
        u16_ptr = it.TensorHandle(ptr.data, tl.pointer_type(tl.uint16))
        old = cas(builder, u16_ptr, cmp_bits, val_bits, sem, scope)
        return it.TensorHandle(old.data, tl.bfloat16)

    # ---- conversions --------------------------------------------------------------------

    def cast_impl(self, builder, src, dst_type):
        if _is_bf16(dst_type):  # from fp64 exactly, so that integers and fp32 round once
            return it.TensorHandle(bf16_bits(np.asarray(src.data).astype(np.float64)),
                                   tl.bfloat16)
        if _is_bf16(src.dtype):
            with np.errstate(invalid="ignore", over="ignore"):
                data = np.asarray(src.data).astype(self._get_np_dtype(dst_type))
            return it.TensorHandle(data, dst_type.scalar)
        return self.original["cast_impl"](builder, src, dst_type)

    def create_fp_to_fp(self, builder, src, dst_type, rounding_mode):
        fp_to_fp = self.original["create_fp_to_fp"]
        if not (_is_bf16(src.dtype) or _is_bf16(dst_type)):
            return fp_to_fp(builder, src, dst_type, rounding_mode)
        values = src.data
        if src.dtype.scalar.primitive_bitwidth == 8:  # fp8: its own decoder, to fp32
            values = fp_to_fp(builder, src, tl.float32, rounding_mode).data
        if _is_bf16(dst_type):
            toward_zero = rounding_mode == it._ir.ROUNDING_MODE.RTZ
            return it.TensorHandle(bf16_bits(np.asarray(values), toward_zero), tl.bfloat16)
        as_fp32 = it.TensorHandle(np.asarray(values, dtype=np.float32), tl.float32)
        return fp_to_fp(builder, as_fp32, dst_type, rounding_mode)

    def create_bitcast(self, builder, src, dst_type):
        if _is_bf16(src.dtype) and not isinstance(src.dtype, tl.pointer_type):
            src = it.TensorHandle(bf16_bits(src.data), tl.uint16)
        if _is_bf16(dst_type) and not isinstance(dst_type, tl.pointer_type):
            return it.TensorHandle(np.asarray(src.data).view(U16), tl.bfloat16)
        return self.original["create_bitcast"](builder, src, dst_type)

    # ---- arithmetic ---------------------------------------------------------------------

    def create_fabs(self, builder, arg):
        if arg.dtype == tl.bfloat16:
            return it.TensorHandle(np.abs(arg.data), tl.bfloat16)
        return self.original["create_fabs"](builder, arg)

    def create_fma(self, builder, x, y, z):
        if z.dtype == tl.bfloat16:  # x * y is exact in fp64; the sum rounds once more, harmlessly
            product = np.multiply(x.data, y.data, dtype=np.float64)
            return it.TensorHandle(np.add(product, z.data, dtype=np.float64), tl.bfloat16)
        return self.original["create_fma"](builder, x, y, z)

    # ---- reductions and scans -----------------------------------------------------------

    def sum(self, reduce_op, input):
        if input.dtype.scalar == tl.bfloat16:
            total = _pairwise_sum(input.handle.data, reduce_op.axis, reduce_op.keep_dims)
            return reduce_op.to_tensor(total, input.dtype.scalar)
        return self.original["sum"](reduce_op, input)

    def cumsum(self, scan_op, input):
        if input.dtype.scalar == tl.bfloat16:
            return [scan_op.to_tensor(_scan(input.handle.data, scan_op.axis, np.add),
                                      tl.bfloat16)]
        return self.original["cumsum"](scan_op, input)

    def cumprod(self, scan_op, input):
        if input.dtype.scalar == tl.bfloat16:
            return [scan_op.to_tensor(_scan(input.handle.data, scan_op.axis, np.multiply),
                                      tl.bfloat16)]
        return self.original["cumprod"](scan_op, input)


# Triton's language and interpreter modules, imported when the patch is first installed (this
# module imports without Triton: its rounding helpers need only NumPy)
tl: Any = None
it: Any = None


def _import_triton() -> None:
    global tl, it
    import triton.language
    from triton.runtime import interpreter

    tl, it = triton.language, interpreter


def _as_bf16_values(handle: Any) -> None:
    """A bf16 handle's data as float32 bf16 numbers: 16-bit patterns decoded, floats rounded
    (anything else, a comparison's bools typed bf16, say, stays)."""
    data = np.asarray(handle.data)
    if data.dtype.kind == "f":
        handle.data = round_bf16(data)
    elif data.dtype.kind in "iu" and data.dtype.itemsize == 2:
        handle.data = bf16_values(data)


class _Unpatched:
    """The scope of a helper call that patched nothing: nothing to restore."""

    def restore(self) -> None:
        pass


class _LaunchScope:
    """A launch's patch scope: restoring it ends the launch for ExactBf16._patch_lang."""

    def __init__(self, scope: Any, patch: ExactBf16) -> None:
        self.scope, self.patch = scope, patch

    def restore(self) -> None:
        self.patch._launch_langs = None
        self.scope.restore()


def _is_bf16(t: Any) -> bool:
    """Whether a Triton type is bf16, or a block or a pointer of bf16."""
    while isinstance(t, (tl.block_type, tl.pointer_type)):
        t = t.element_ty
    return t == tl.bfloat16


def _method(bound: Callable[..., Any]) -> Callable[..., Any]:
    """A plain function calling `bound` with its own `self` first: set on a class, it is a
    method whose instance reaches the patch's method as its first argument."""

    def method(obj: Any, *args: Any, **kwargs: Any) -> Any:
        return bound(obj, *args, **kwargs)

    return method


def _nan_dropping(op: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., Any]:
    """A builder method computing op (np.fmax, np.fmin) elementwise, in any dtype."""

    def method(builder: Any, lhs: Any, rhs: Any) -> Any:
        return builder.binary_op(lhs, rhs, op)

    return method


_ACTIVE = ExactBf16()
_depth = 0


@contextmanager
def exact_bf16() -> Iterator[None]:
    """Within the block, Triton's interpreter computes bf16 as a GPU does (see module doc).
    Nestable; a no-op where Triton is not installed."""
    global _depth
    try:
        import triton.runtime.interpreter  # noqa: F401
    except ImportError:
        yield
        return
    if _depth == 0:
        _ACTIVE.install()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _ACTIVE.undo()



# ---- cooperative launches: every program of the grid at once ------------------------------


class CooperativeDeadlock(RuntimeError):
    """A cooperative launch under the interpreter in which no program changed memory for the
    watchdog's time: its programs wait for each other (on a GPU it would never finish)."""


class BarrierTrap(RuntimeError):
    """A program of a cooperative launch under the interpreter executed the resident
    barrier's trap (kernels/triton/row_parts.py, `trap`): on a GPU the launch fails."""


class _Abort(BaseException):
    """Raised inside a program's thread, at its next memory operation, to stop it."""


class _Launch:
    """One cooperative launch: its programs' threads, what they raised, the watchdog's clock."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.abort = threading.Event()
        self.last_progress = time.monotonic()

    def start(self, fn: Callable[..., Any], idx: tuple[int, int, int], args: dict,
              local: threading.local) -> None:
        """Start the program `idx` of the grid in a thread of its own."""

        def program() -> None:
            local.launch, local.grid_idx = self, idx
            try:
                fn(**args)
            except BaseException as e:  # re-raised by join
                self.errors.append(e)
                self.abort.set()
            finally:
                self.last_progress = time.monotonic()

        thread = threading.Thread(target=program, name=f"triton-program-{idx}", daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        """Wait for every program. CooperativeDeadlock when none changed memory for
        timeout_s (each is then stopped at its next memory operation); else the first error
        a program raised, if any."""
        deadlock = False
        while any(t.is_alive() for t in self.threads):
            for t in self.threads:
                t.join(0.02)
            if self.abort.is_set():  # a program failed: the others may be waiting for it
                break
            if time.monotonic() - self.last_progress > self.timeout_s:
                self.abort.set()
                deadlock = True
                break
        for t in self.threads:
            t.join(10.0)
        if deadlock:
            stuck = sum(t.is_alive() for t in self.threads)
            raise CooperativeDeadlock(
                f"cooperative launch of {len(self.threads)} programs: none changed memory "
                f"for {self.timeout_s:g} s, so they wait for each other (on a GPU this "
                f"launch would hang); stopped them"
                + (f" ({stuck} still running without touching memory)" if stuck else ""))
        real = [e for e in self.errors if not isinstance(e, _Abort)]
        if real:
            raise real[0]


def _trap_within(error: BaseException) -> BarrierTrap | None:
    """The BarrierTrap that `error` wraps (the interpreter re-raises what a program raised as
    its own InterpreterError, at each level), if any: the launch fails with it, as a GPU's
    trap fails it."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, BarrierTrap):
            return seen
        seen = seen.__cause__
    return None


class _Programs:
    """Stands in for a kernel's function in GridExecutor: each call (one per program, in
    the interpreter's loop over the grid) starts that program in a thread; the call for the
    grid's last program waits for all of them. Signature and globals are the kernel's, which
    the executor reads."""

    def __init__(self, fn: Callable[..., Any], patch: CooperativeGrid, launch: _Launch) -> None:
        self.fn, self.patch, self.launch = fn, patch, launch
        self.__globals__ = fn.__globals__
        self.__signature__ = inspect.signature(fn)
        self.__name__ = fn.__name__

    def __call__(self, **args: Any) -> None:
        builder = it.interpreter_builder
        idx = tuple(builder.grid_idx)
        self.launch.start(self.fn, idx, args, self.patch.local)
        if all(i == d - 1 for i, d in zip(idx, builder.grid_dim, strict=True)):
            self.launch.join()


class CooperativeGrid:
    """The patch behind `cooperative_grid()`. GridExecutor.__call__ hands a cooperative
    launch's kernel to `_Programs`; the program id is read per thread; every memory
    operation first stops its thread when the launch is aborted, notes progress (a store, or
    an atomic that can change memory) and, after an atomic that cannot (a spin-wait's read),
    sleeps briefly so the programs that are working get the interpreter's lock."""

    MEMORY = ("create_masked_load", "create_masked_store", "create_atomic_rmw",
              "create_atomic_cas")
    SPIN_SLEEP_S = 1e-4

    def __init__(self) -> None:
        self.timeout_s = 60.0
        self.local = threading.local()  # .launch and .grid_idx inside a program's thread
        self.lock = threading.RLock()
        self._saved: list[tuple[Any, str, Any]] = []

    @staticmethod
    def supported() -> bool:
        """Whether this Triton's interpreter has what the patch replaces."""
        _import_triton()
        return (callable(it.GridExecutor.__dict__.get("__call__"))
                and "create_get_program_id" in it.InterpreterBuilder.__dict__
                and "set_grid_idx" in it.InterpreterBuilder.__dict__
                and hasattr(it, "interpreter_builder") and callable(it.__dict__.get("_patch_lang"))
                and "rewrite" in it.InterpretedFunction.__dict__
                and all(name in it.InterpreterBuilder.__dict__ for name in CooperativeGrid.MEMORY))

    def install(self) -> None:
        _import_triton()
        self._set(it.GridExecutor, "__call__", self._executor_call)
        self._set(it.InterpreterBuilder, "create_get_program_id", self._program_id)
        for name in self.MEMORY:
            self._set(it.InterpreterBuilder, name, self._memory_op)
        # a device function's first call rewrites it, adding to its module's globals, while
        # another program's call may be iterating over them (_patch_lang): one at a time
        self._set(it, "_patch_lang", self._serialized)
        self._set(it.InterpretedFunction, "rewrite", self._serialized)
        if "create_inline_asm" in it.InterpreterBuilder.__dict__:
            self._set(it.InterpreterBuilder, "create_inline_asm", self._inline_asm)

    def undo(self) -> None:
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()

    def _set(self, owner: Any, name: str,
             make: Callable[[str, Any], Callable[..., Any]]) -> None:
        """Replace owner.name by make(name, the original)."""
        original = owner.__dict__[name]
        self._saved.append((owner, name, original))
        setattr(owner, name, make(name, original))

    def _serialized(self, name: str, original: Any) -> Callable[..., Any]:
        def serialized(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                return original(*args, **kwargs)

        return serialized

    def _executor_call(self, name: str, original: Any) -> Callable[..., Any]:
        def call(executor: Any, *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("launch_cooperative_grid"):
                return original(executor, *args, **kwargs)
            real = executor.fn
            executor.fn = _Programs(real, self, _Launch(self.timeout_s))
            try:
                return original(executor, *args, **kwargs)
            except Exception as e:  # the interpreter wraps what a program raised: unwrap a trap
                trap = _trap_within(e)
                if trap is None:
                    raise
                raise trap from None
            finally:
                executor.fn = real

        return call

    TRAP = "trap;"  # what the GPU's trap looks like in a kernel's inline assembly

    def _inline_asm(self, name: str, original: Any) -> Callable[..., Any]:
        def inline_asm(builder: Any, asm: str, *args: Any, **kwargs: Any) -> Any:
            if self.TRAP in asm and getattr(self.local, "launch", None) is not None:
                idx = getattr(self.local, "grid_idx", None)
                raise BarrierTrap(f"program {idx[0] if idx else '?'} of a cooperative launch "
                                  f"executed `trap` ({asm.splitlines()[0].strip()}): a row's "
                                  "programs did not all reach its barrier within the bounded "
                                  "wait; on a GPU the launch fails")
            return original(builder, asm, *args, **kwargs)

        return inline_asm

    def _program_id(self, name: str, original: Any) -> Callable[..., Any]:
        def program_id(builder: Any, axis: int) -> Any:
            idx = getattr(self.local, "grid_idx", None)
            if idx is None:
                return original(builder, axis)
            return it.TensorHandle(np.array([idx[axis]], dtype=np.int32), tl.int32)

        return program_id

    def _memory_op(self, name: str, original: Any) -> Callable[..., Any]:
        def op(builder: Any, *args: Any, **kwargs: Any) -> Any:
            launch = getattr(self.local, "launch", None)
            if launch is None:
                return original(builder, *args, **kwargs)
            if launch.abort.is_set():
                raise _Abort()
            if name.startswith("create_atomic"):  # exact_bf16's are several steps: one at a time
                with self.lock:
                    result = original(builder, *args, **kwargs)
            else:
                result = original(builder, *args, **kwargs)
            if _may_change_memory(name, args, result):
                launch.last_progress = time.monotonic()
            elif name != "create_masked_load":
                time.sleep(self.SPIN_SLEEP_S)
            return result

        return op


def _may_change_memory(name: str, args: tuple, result: Any) -> bool:
    """Whether a memory operation (the builder method `name` with its arguments after the
    builder, and its result) can have changed memory: a store; an atomic other than adding,
    or-ing or xor-ing zeros; a compare-and-swap that found its expected value."""
    if name == "create_masked_store":
        return True
    if name == "create_atomic_rmw":
        op, _, val, mask = args[:4]
        neutral = (it._ir.ATOMIC_OP.ADD, it._ir.ATOMIC_OP.FADD, it._ir.ATOMIC_OP.OR,
                   it._ir.ATOMIC_OP.XOR)
        values = np.broadcast_to(np.asarray(val.data), np.shape(mask.data))[np.asarray(mask.data)]
        return op not in neutral or bool(np.any(values != 0))
    if name == "create_atomic_cas":
        return bool(np.any(np.asarray(result.data) == np.asarray(args[1].data)))
    return False


_COOPERATIVE = CooperativeGrid()
_coop_depth = 0


def cooperative_supported() -> bool:
    """Whether `cooperative_grid()` can run here (Triton installed, its interpreter has what
    the patch replaces)."""
    try:
        return CooperativeGrid.supported()
    except ImportError:
        return False


@contextmanager
def cooperative_grid(timeout_s: float = 60.0) -> Iterator[None]:
    """Within the block, Triton's interpreter runs each launch that asks for a cooperative
    grid with all its programs at once (see module doc); a launch in which no program changes
    memory for timeout_s fails with CooperativeDeadlock. Nestable (the outermost block's
    timeout holds); RuntimeError where this Triton's interpreter lacks what it patches."""
    global _coop_depth
    if not cooperative_supported():
        raise RuntimeError("this Triton's interpreter cannot run cooperative launches "
                           "(elasticbench.triton_interpreter.CooperativeGrid.supported)")
    if _coop_depth == 0:
        _COOPERATIVE.timeout_s = timeout_s
        _COOPERATIVE.install()
    _coop_depth += 1
    try:
        yield
    finally:
        _coop_depth -= 1
        if _coop_depth == 0:
            _COOPERATIVE.undo()
