"""Loads and stores in fp32, and where the Triton interpreter is slow.

Every kernel loads its dtype, computes in fp32 and rounds once on the store. bf16 needs nothing
special here: on a GPU it converts natively, and under the interpreter `launch.run` calls every
kernel inside `elasticbench.triton_interpreter.exact_bf16`, which gives the interpreter the
GPU's bf16. The interpreter does run a reduce with a custom combine element by element in
Python, so the NaN-propagating maximum takes a vectorized form there.
"""

from __future__ import annotations

import triton
import triton.language as tl

from elasticbench.devices import triton_interpreted

# read when this module is imported, as Triton reads TRITON_INTERPRET when `triton.jit` decorates
INTERPRETED = tl.constexpr(triton_interpreted())


@triton.jit
def ld(ptrs, mask, other, EVEN: tl.constexpr):
    """Load as fp32; lanes outside mask read as other. EVEN: the block tiles the row exactly,
    so no lane is outside and the load needs no mask (nor the selects a mask costs)."""
    if EVEN:
        v = tl.load(ptrs).to(tl.float32)
    else:
        v = tl.load(ptrs, mask=mask, other=other).to(tl.float32)
    return v


@triton.jit
def st(ptrs, v, mask, EVEN: tl.constexpr):
    """Store fp32 v rounded once (to nearest even) to the pointer's type."""
    v = v.to(ptrs.dtype.element_ty)
    if EVEN:
        tl.store(ptrs, v)
    else:
        tl.store(ptrs, v, mask=mask)


@triton.jit
def _max_nan_combine(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def max_nan(v, AXIS: tl.constexpr = 0):
    """Maximum of a block along AXIS; NaN if any element there is NaN. The GPU gets one
    max.NaN per element; the interpreter the same value from a max and a NaN count
    (NumPy-vectorized)."""
    if INTERPRETED:
        top = tl.where(tl.max((v != v).to(tl.int32), axis=AXIS) > 0, float("nan"),
                       tl.max(v, axis=AXIS))
    else:
        top = tl.reduce(v, AXIS, _max_nan_combine)
    return top


@triton.jit
def tile_mask(row, rows, cols, n, ROWS: tl.constexpr, BLOCK: tl.constexpr,
              EVEN: tl.constexpr):
    """The (ROWS, BLOCK) mask of a block of rows (several short rows per program): rows past
    `rows` off and, unless EVEN, columns past n. With EVEN the mask is constant along a row,
    which keeps the loads and stores vectorized."""
    live = (row < rows)[:, None]
    m = tl.broadcast_to(live, (ROWS, BLOCK)) if EVEN else live & (cols < n)[None, :]
    return m
