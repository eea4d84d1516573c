"""The attention kernel contract: how `verify` and `run` call a registered attention kernel.

A kernel registered with function="elastic_attention" (or "softmax_attention") is called

    forward:   fn(q, k, v, *, scale, causal, **row_params) -> out
    backward:  fn(q, k, v, *, scale, causal, **row_params) -> step;  step(dout) -> grads

q, k, v (batch, heads, length, dim) and dout arrive in the backend's array type and the
case's dtype; every row parameter (tau and beta for elastic) arrives in the form the kernel
declares (KernelSpec.param_form): by default a (batch, heads) array of the backend's type
in the working precision (fp64 for fp64 inputs, else fp32), or a Python float ("float"),
or a (batch, heads) array in the case's dtype ("own", judged against the reference of the
rounded value); scale is a float, causal a bool: True asks for the causal mask the kernel
declares (KernelSpec.causal: "top_left", key j visible to query i when j <= i, SDPA's
is_causal and the default; or "bottom_right", j <= i + length_k - length_q,
FlashAttention's), and the reference follows that declaration. A case with a mask passes it
to the kernels that declare
a parameter for it: `attn_mask` takes any mask as SDPA does (bool, True takes part, or float,
added to the scores; (batch, heads, length_q, length_k) or broadcastable), `key_mask` only a
key-padding one, as a (batch, length_k) bool array; other kernels are not given the case. A gated case (the attention parameter gate = 1)
passes `gate`, (batch, heads, length_q, value_dim) in the case's dtype, values in (0, 1), to
the kernels that declare it (others are not given the case): out is then attention * gate,
and step(dout) returns d gate after the other gradients.
out has q's dtype and shape (batch, heads, length_q,
value_dim). A backward kernel does whatever forward it needs in its first call, which a
benchmark leaves untimed, and returns `step`; step(dout) returns (dq, dk, dv, *dparams), the
parameter gradients per (batch, head) in the row function's order (dtau, dbeta). The kernel
must not write its inputs. docs/attention.md section 4 says the same for kernel authors.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from elasticbench.harness.backends import get_backend
from elasticbench.harness.functions import get_attention_function
from elasticbench.harness.kernel_spec import BOTTOM_RIGHT, CAUSAL_CONVENTIONS, TOP_LEFT
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.registry import KernelSpec

__all__ = ["BOTTOM_RIGHT", "CAUSAL_CONVENTIONS", "TOP_LEFT", "backward_step",
           "causal_offset", "causal_reference", "conventions_differ", "forward_output",
           "head_arrays", "kernel_arguments", "mask_argument", "other_convention",
           "own_params", "work_numpy_dtype"]


def work_numpy_dtype(dtype: str) -> np.dtype:
    """The working precision of a case's dtype: fp64 for fp64, else fp32."""
    return np.dtype(np.float64 if get_format(dtype).name == "fp64" else np.float32)


def head_arrays(params: dict[str, float], row_params: tuple[str, ...], batch: int,
                heads: int, dtype: str) -> dict[str, np.ndarray]:
    """The row parameters as (batch, heads) NumPy arrays in the working precision."""
    wd = work_numpy_dtype(dtype)
    return {name: np.full((batch, heads), params[name], dtype=wd) for name in row_params}


def own_params(params: dict[str, float], row_params: tuple[str, ...], dtype: str
               ) -> dict[str, float]:
    """params with the row parameters rounded to the case's format: what a kernel that takes
    them in its own format (param_form "own") is given, so its reference uses them too."""
    fmt = get_format(dtype)
    return {n: float(fmt.cast(np.float64(v))) if n in row_params else v
            for n, v in params.items()}


def causal_offset(lq: int, lk: int, convention: str) -> int:
    """The diagonal's offset: query i sees key j when j <= i + offset (0 top-left,
    lk - lq bottom-right)."""
    if convention not in CAUSAL_CONVENTIONS:
        raise ValueError(f"unknown causal convention {convention!r} (choose from "
                         f"{', '.join(CAUSAL_CONVENTIONS)})")
    return lk - lq if convention == BOTTOM_RIGHT else 0


def conventions_differ(shape: tuple[int, ...], params: dict[str, float]) -> bool:
    """Whether a case is judged differently under the two conventions: causal, with the
    query and key lengths (shape[2], shape[3]) unequal."""
    return bool(params.get("causal", 0.0)) and shape[2] != shape[3]


def other_convention(convention: str) -> str:
    """bottom_right for top_left and the reverse."""
    return TOP_LEFT if convention == BOTTOM_RIGHT else BOTTOM_RIGHT


def causal_reference(params: dict[str, float], shape: tuple[int, ...],
                     bias: np.ndarray | None, convention: str
                     ) -> tuple[dict[str, float], np.ndarray | None]:
    """(params, bias) the reference is computed with for a kernel of this convention: as
    they are for top-left (the reference's own causal) or where the conventions agree;
    for bottom-right, causal turned off and its diagonal written into the bias (-inf on
    the keys it hides, combined with the case's mask), which the reference and the
    budgets take as any mask."""
    if convention == TOP_LEFT or not conventions_differ(shape, params):
        return params, bias
    b, h, lq, lk = shape[:4]
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    hidden = j > i + causal_offset(lq, lk, convention)
    base = np.zeros((b, h, lq, lk)) if bias is None else np.broadcast_to(bias, (b, h, lq, lk))
    return {**params, "causal": 0.0}, np.where(hidden, -np.inf, base)


def mask_argument(spec: KernelSpec, mask: np.ndarray | None) -> dict[str, np.ndarray] | None:
    """The keyword the kernel takes this mask by ({} for no mask), or None where it takes
    none that fits: `attn_mask` as it is, `key_mask` (batch, length_k) for key padding."""
    if mask is None:
        return {}
    takes = inspect.signature(spec.fn).parameters
    if "attn_mask" in takes:
        return {"attn_mask": mask}
    if "key_mask" in takes and mask.dtype == bool and mask.shape[1:3] == (1, 1):
        return {"key_mask": np.ascontiguousarray(mask[:, 0, 0, :])}
    return None


def kernel_arguments(spec: KernelSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                     params: dict[str, float], dtype: str, scale: float,
                     mask: np.ndarray | None = None, gate: np.ndarray | None = None
                     ) -> tuple[tuple[Any, Any, Any], dict[str, Any]]:
    """Fresh backend copies of q, k, v and the keyword arguments of the contract (the mask
    by mask_argument; a kernel that takes none that fits is never given a masked case; a
    gated case's gate, (batch, heads, length_q, value_dim) in the case's dtype, as `gate`
    to a kernel that declares it, the only ones given gated cases)."""
    backend = get_backend(spec.backend)
    fn = get_attention_function(spec.function)
    kw: dict[str, Any]
    if spec.param_form == "float":
        kw = {name: float(params[name]) for name in fn.row_params}
    elif spec.param_form == "own":
        fmt = get_format(dtype)
        kw = {name: backend.to_native(np.full((q.shape[0], q.shape[1]), params[name],
                                              dtype=fmt.numpy))
              for name in fn.row_params}
    else:
        heads = head_arrays(params, fn.row_params, q.shape[0], q.shape[1], dtype)
        kw = {name: backend.to_native(a) for name, a in heads.items()}
    kw.update(scale=float(scale), causal=bool(params.get("causal", 0.0)))
    kw.update({name: backend.to_native(a)
               for name, a in (mask_argument(spec, mask) or {}).items()})
    if gate is not None:
        kw["gate"] = backend.to_native(gate)
    return (backend.to_native(q), backend.to_native(k), backend.to_native(v)), kw


def forward_output(value: Any) -> Any:
    """The output of a forward kernel (a tuple's first element: kernels may return their
    row statistics beside it)."""
    return value[0] if isinstance(value, tuple | list) else value


def backward_step(value: Any) -> Callable[[Any], Any]:
    """The step a backward kernel's first call returned; TypeError if it is not callable."""
    if not callable(value):
        raise TypeError(f"an attention backward kernel returns step(dout), got "
                        f"{type(value).__name__}")
    return value
