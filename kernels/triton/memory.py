"""Loads and stores in fp32, and where the Triton interpreter needs emulating.

On a GPU bf16 converts natively (exact widening, round-to-nearest-even narrowing). The
interpreter's own bf16 <-> fp32 conversion is not exact (no sticky bit, subnormals mangled),
so under it bf16 tensors are passed as int16 and converted here with integer operations that
do what the hardware does (BITS=True). The interpreter also runs a reduce with a custom combine
element by element in Python, so the NaN-propagating maximum takes a vectorized form there.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


# read when this module is imported, as Triton reads TRITON_INTERPRET when `triton.jit` decorates
INTERPRETED = tl.constexpr(interpreted())


def native(*tensors: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], bool]:
    """The tensors as the kernels see them, and BITS (bf16 as int16 under the interpreter)."""
    if interpreted() and tensors[0].dtype == torch.bfloat16:
        return tuple(t.view(torch.int16) for t in tensors), True
    return tensors, False


@triton.jit
def ld(ptrs, mask, other, BITS: tl.constexpr, EVEN: tl.constexpr):
    """Load as fp32; lanes outside mask read as other. EVEN: the block tiles the row exactly,
    so no lane is outside and the load needs no mask (nor the selects a mask costs)."""
    if BITS:
        if EVEN:
            u = tl.load(ptrs).to(tl.int32) & 0xFFFF
        else:
            u = tl.load(ptrs, mask=mask, other=0).to(tl.int32) & 0xFFFF
        v = (u << 16).to(tl.float32, bitcast=True)
        if not EVEN:
            v = tl.where(mask, v, other)
    elif EVEN:
        v = tl.load(ptrs).to(tl.float32)
    else:
        v = tl.load(ptrs, mask=mask, other=other).to(tl.float32)
    return v


@triton.jit
def st(ptrs, v, mask, BITS: tl.constexpr, EVEN: tl.constexpr):
    """Store fp32 v rounded once to the pointer's type (bf16 bits when BITS)."""
    if BITS:
        u = v.to(tl.uint32, bitcast=True)
        rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
        quiet_nan = (u >> 16) | 0x40
        is_nan = (u & 0x7FFFFFFF) > 0x7F800000
        v = tl.where(is_nan, quiet_nan, rounded).to(tl.int16)
    else:
        v = v.to(ptrs.dtype.element_ty)
    if EVEN:
        tl.store(ptrs, v)
    else:
        tl.store(ptrs, v, mask=mask)


@triton.jit
def _max_nan_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def max_nan(v):
    """Maximum of a block; NaN if any element is NaN. The GPU gets one max.NaN per element;
    the interpreter the same value from a max and a NaN count (NumPy-vectorized)."""
    if INTERPRETED:
        top = tl.where(tl.max((v != v).to(tl.int32), axis=0) > 0, float("nan"),
                       tl.max(v, axis=0))
    else:
        top = tl.reduce(v, 0, _max_nan_combine)
    return top
