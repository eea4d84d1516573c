"""Backends: how an input array reaches a kernel and how its output comes back.

A backend owns the conversions between the NumPy arrays the core works with and the
kernel's own array type, and names the device its kernels run on, which says how to wait for
them, time them and how large a cache they see (elasticbench.devices). The core calls these
and never branches on a backend's name or probes for a GPU itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from elasticbench import devices
from elasticbench.harness.inputs.layouts import LAYOUTS, Placement, view_of
from elasticbench.settings import settings


@dataclass(frozen=True)
class Backend:
    name: str
    summary: str
    unavailable: Callable[[], str | None]  # why it cannot run here, in one line; None: it can
    to_native: Callable[[np.ndarray], Any]  # a fresh copy in the kernel's array type
    to_numpy: Callable[[Any], np.ndarray]  # TypeError when given something else
    same_memory: Callable[[Any, Any], bool]
    calling: Callable[[], AbstractContextManager[Any]] = nullcontext  # what verified calls run in
    # whether its kernels run here in an interpreter standing in for the device they are
    # written for, which accepts code that device's compiler rejects (verify then compiles
    # them: elasticbench.harness.verify.compile_check)
    interpreted: Callable[[], bool] = lambda: False
    device: Callable[[], str] = lambda: devices.HOST  # where its arrays live and kernels run
    # the 2-D view a placement describes, into a native copy of its buffer (inputs/layouts.py)
    view: Callable[[Any, Placement], Any] = view_of
    layouts: tuple[str, ...] = LAYOUTS  # the input layouts its kernels must accept
    # environment variables that change how its kernels run: a reproduce command sets them
    # (a name ending in "*" stands for every variable it begins)
    env_vars: tuple[str, ...] = ()
    # its own compiled exp for the roofline's exp ceiling (docs/benchmarking.md section 1):
    # returns f(x) -> the sum of exp(x) over a 1-D native array of x <= 0, or None when that
    # tier is not available here
    exp_probe: Callable[[], Callable[[Any], Any] | None] | None = None
    # whether its kernels may be torch autograd functions, whose gradients can carry a graph
    # (verify --mode bwd then probes their second order: elasticbench.harness.verify.second_order)
    autograd: bool = False
    # whether its kernels may compile code for each input shape they meet (torch.compile, a
    # JIT): verify keeps each such kernel in one process, where its code serves every case
    # (verify/lanes.py); a kernel may say otherwise when it is registered
    compiles: bool = False

    def available(self) -> bool:
        """Whether kernels of this backend can run here (see `unavailable` for why not)."""
        return self.unavailable() is None

    def environment(self) -> dict[str, str]:
        """The env_vars that are set here, with their values."""
        exact = {k for k in self.env_vars if not k.endswith("*")}
        prefixes = tuple(k[:-1] for k in self.env_vars if k.endswith("*"))
        return {k: v for k, v in sorted(os.environ.items())
                if k in exact or (prefixes and k.startswith(prefixes))}

    def synchronize(self) -> None:
        """Wait until its kernels' work is done (they may return before, on a GPU)."""
        devices.synchronize(self.device())

    def clock(self) -> devices.Clock:
        """A clock for timing its kernels (devices.Clock)."""
        return devices.clock(self.device())

    def llc_bytes(self) -> int:
        """The last-level cache of its device, which decides in-cache or out-of-cache."""
        return devices.llc_bytes(self.device())


def _numpy_to_numpy(a: Any) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"expected a numpy.ndarray, got {type(a).__name__}")
    return a


def _numpy_same_memory(a: Any, b: Any) -> bool:
    return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.shares_memory(a, b)


def _torch_device() -> str:
    """Where torch kernels run: $ELASTICBENCH_TORCH_DEVICE (elasticbench.settings), default
    cpu."""
    return settings().torch_device


def _cpu_tensor(a: np.ndarray) -> Any:
    """A fresh CPU tensor holding a copy of a (bf16 included)."""
    import ml_dtypes
    import torch

    if a.dtype == ml_dtypes.bfloat16:  # torch.from_numpy does not know ml_dtypes
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _torch_to_native(a: np.ndarray) -> Any:
    return _cpu_tensor(a).to(_torch_device())


def _torch_to_numpy(t: Any) -> np.ndarray:
    import ml_dtypes
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _torch_same_memory(a: Any, b: Any) -> bool:
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    return sa.data_ptr() == sb.data_ptr()


def _torch_view(base: Any, placement: Placement) -> Any:
    return base.as_strided(placement.shape, placement.strides, placement.offset)


def _cpp_exp_probe() -> Callable[[Any], Any] | None:
    """The native tier's exp+sum, the exponential its row kernels use (None unbuilt)."""
    if devices.native_unavailable() is not None:
        return None
    from elasticbench.native import load

    return load().exp_sum


def _triton_device() -> str:
    """A CUDA GPU; the host when Triton's interpreter runs the kernels (even beside a GPU)."""
    return devices.HOST if devices.triton_interpreted() else "cuda"


def _triton_to_native(a: np.ndarray) -> Any:
    return _cpu_tensor(a).to(_triton_device())


def _triton_calling() -> AbstractContextManager[Any]:
    """Under Triton's interpreter, exact bf16 for the kernel (elasticbench.triton_interpreter)."""
    if devices.triton_interpreted():
        from elasticbench.triton_interpreter import exact_bf16

        return exact_bf16()
    return nullcontext()


# "1": the flex_attention backward runs on CPU tensors through FlexAttention's eager dense
# path, torch's CPU guard lifted (elasticbench/harness/builtin/flex_attention.py); unset, it declines them
FLEX_CPU_BACKWARD_ENV = "ELASTICBENCH_FLEX_CPU_BACKWARD"


def _flex_unavailable() -> str | None:
    """Why torch's FlexAttention cannot be used here, in one line; None when it can."""
    if why := devices.torch_unavailable():
        return why
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as e:
        import torch

        return f"torch {torch.__version__} has no FlexAttention ({e})"
    return None


BACKENDS: dict[str, Backend] = {
    "numpy": Backend(
        "numpy",
        "NumPy arrays on the CPU (bf16 through ml_dtypes)",
        lambda: None,
        lambda a: a.copy(),
        _numpy_to_numpy,
        _numpy_same_memory,
    ),
    "torch": Backend(
        "torch",
        "torch tensors (CPU by default; $ELASTICBENCH_TORCH_DEVICE=cuda for a GPU)",
        devices.torch_unavailable,
        _torch_to_native,
        _torch_to_numpy,
        _torch_same_memory,
        device=_torch_device,
        view=_torch_view,
        env_vars=("ELASTICBENCH_TORCH_DEVICE",),
        autograd=True,
        compiles=True,
    ),
    "cpp": Backend(
        "cpp",
        "native C++ kernels on CPU torch tensors, built through torch's extension API",
        devices.native_unavailable,
        _cpu_tensor,
        _torch_to_numpy,
        _torch_same_memory,
        view=_torch_view,
        exp_probe=_cpp_exp_probe,
        autograd=True,
    ),
    "triton": Backend(
        "triton",
        "Triton kernels on a CUDA GPU (or the CPU under TRITON_INTERPRET=1); torch tensors",
        devices.triton_unavailable,
        _triton_to_native,
        _torch_to_numpy,
        _torch_same_memory,
        calling=_triton_calling,
        interpreted=devices.triton_interpreted,
        device=_triton_device,
        view=_torch_view,
        # a Triton kernel gets its rows through a row stride; elements of a row are adjacent
        layouts=("packed", "padded", "offset"),
        # the launch options (kernels/triton/launch.py: ELASTICBENCH_TRITON_SPLITS, ...)
        env_vars=("TRITON_INTERPRET", "ELASTICBENCH_TRITON_*"),
        compiles=True,
    ),
    "flex_attention": Backend(
        "flex_attention",
        "torch's FlexAttention (compiled on CUDA; eager and forward-only on the CPU); torch "
        "tensors on $ELASTICBENCH_TORCH_DEVICE",
        _flex_unavailable,
        _torch_to_native,
        _torch_to_numpy,
        _torch_same_memory,
        device=_torch_device,
        view=_torch_view,
        env_vars=("ELASTICBENCH_TORCH_DEVICE", FLEX_CPU_BACKWARD_ENV),
        autograd=True,
        compiles=True,
    ),
}
BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)


def device_of(backend_names: list[str]) -> str:
    """The device kernels of these backends run on: the first that is not the host, if any."""
    names = [get_backend(b).device() for b in backend_names]
    return next((d for d in names if d != devices.HOST), devices.HOST)


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown backend {name!r} (choose from {', '.join(BACKEND_NAMES)})"
        ) from None
