"""The backward's certified sweeps in native code (kernels/cpp/reference_grad.cpp): which
library runs them, and the call. rows_grad.py holds their NumPy form, which the
native one follows operation for operation, so dx and the parameter gradients are the same
bits (docs/numerics.md section 6.12)."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from elasticbench.harness.functions.definition import OFFSET, ROW_FINITE, TEMPERATURE, Function
from elasticbench.harness.numerics.certified.bounds import SLACK, Bounded, Shift
from elasticbench.settings import settings

ROLES = {OFFSET: 0, TEMPERATURE: 1}  # reference_grad.cpp's codes for the parameters' roles
Out = tuple[np.ndarray, np.ndarray, np.ndarray]  # hi, lo and bound, written in place

_library: ModuleType | None = None


def use_native(library: ModuleType | None) -> None:
    """Run the sweeps in this native library (the native tier's) from now on; None: in
    NumPy. The layers above choose: verify's and hunt's reference processes take the library
    where it is built (elasticbench.native.built)."""
    global _library
    _library = library


def native_sweeps(fn: Function) -> ModuleType | None:
    """The library given to use_native, for fn, unless turned off
    (ELASTICBENCH_REFERENCE=numpy); a parameter of a role it does not know takes the NumPy
    form, which says it has no gradient rule."""
    if (settings().reference == "numpy"
            or any(p.role not in ROLES for p in fn.params)):
        return None
    return _library


def run(library: ModuleType, fn: Function, x: np.ndarray, g: np.ndarray, y: Bounded,
        sh: Shift, q: tuple[np.ndarray, np.ndarray, np.ndarray], block: int, dx: Out,
        dp: Out) -> None:
    """The two sweeps over every row at once (certified_grad._chunk_finite's), given q =
    exp(-m/tau)/S per row (hi, lo, bound) and the column block: dx (rows, n) and the
    parameter gradients (rows, parameters) written into dx and dp."""
    import torch

    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (
        x, g, y.hi, y.lo, y.bound, sh.kept, sh.kind == ROW_FINITE, sh.m, *q)]
    library.certified_grad_rows(*t, float(sh.tau), float(sh.offset),
                                [ROLES[p.role] for p in fn.params], block, SLACK,
                                *(torch.from_numpy(a) for a in (*dx, *dp)))
