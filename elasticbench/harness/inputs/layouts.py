"""Input layouts: where in memory a kernel's 2-D input lives, as models lay it out.

A model rarely hands a softmax a freshly packed array: attention scores are often a slice of
a wider buffer (rows padded to an aligned stride), a view that starts inside its storage, or
a transposed view. Each layout places the same values in a fresh 1-D buffer and describes
the 2-D view of them by an element offset and element strides. Every buffer element that is
not part of the view is a NaN canary: a kernel that reads its input as if it were packed
reads canaries (and returns NaN where the truth is finite), and one that writes around its
input changes them.

| layout       | the view                                                   |
|--------------|------------------------------------------------------------|
| `packed`     | row stride n, element stride 1, offset 0 (a fresh array)   |
| `padded`     | row stride n + 3 (rows also misaligned), element stride 1  |
| `offset`     | packed, starting 5 elements into its buffer                |
| `transposed` | element stride = rows, row stride 1: a transposed view     |

Which layouts a backend's kernels must accept is the backend's `layouts`
(docs/inputs.md section 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LAYOUTS: tuple[str, ...] = ("packed", "padded", "offset", "transposed")
PACKED = "packed"
ROW_PADDING = 3  # elements past n in each padded row: an odd pad also misaligns the rows
OFFSET = 5  # elements before an offset view's first element


@dataclass(frozen=True)
class Placement:
    """Values placed in a buffer: view element (i, j) is buffer[offset + i*s0 + j*s1]."""

    layout: str
    buffer: np.ndarray  # 1-D, canaries (NaN) everywhere outside the view
    offset: int
    strides: tuple[int, int]  # in elements
    shape: tuple[int, int]

    def view(self) -> np.ndarray:
        """The 2-D view into this placement's own buffer (a NumPy kernel's input)."""
        return view_of(self.buffer, self)

    def inside(self) -> np.ndarray:
        """Boolean mask over the buffer: True where an element belongs to the view."""
        rows, n = self.shape
        idx = (self.offset + np.arange(rows)[:, None] * self.strides[0]
               + np.arange(n)[None, :] * self.strides[1])
        mask = np.zeros(self.buffer.size, dtype=bool)
        mask[idx.ravel()] = True
        return mask


def view_of(buffer: np.ndarray, placement: Placement) -> np.ndarray:
    """placement's 2-D view into a NumPy buffer laid out like placement.buffer."""
    size = buffer.itemsize
    return np.lib.stride_tricks.as_strided(
        buffer[placement.offset:], placement.shape,
        (placement.strides[0] * size, placement.strides[1] * size))


def check_layout(name: str) -> str:
    if name not in LAYOUTS:
        raise ValueError(f"unknown layout {name!r} (choose from {', '.join(LAYOUTS)})")
    return name


def place(x: np.ndarray, layout: str) -> Placement:
    """x (2-D) copied into a fresh buffer in the given layout."""
    rows, n = x.shape
    check_layout(layout)
    if layout == "padded":
        offset, strides, size = 0, (n + ROW_PADDING, 1), rows * (n + ROW_PADDING)
    elif layout == "offset":
        offset, strides, size = OFFSET, (n, 1), OFFSET + rows * n
    elif layout == "transposed":
        offset, strides, size = 0, (1, rows), rows * n
    else:
        offset, strides, size = 0, (n, 1), rows * n
    buffer = np.full(size, np.nan, dtype=x.dtype)
    placement = Placement(layout, buffer, offset, strides, (rows, n))
    placement.view()[...] = x
    return placement
