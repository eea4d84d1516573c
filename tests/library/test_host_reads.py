"""The CUDA path of the library reads nothing back to the host: no `.item()`, `float()`,
`bool()` of a device tensor, no data-dependent shape (`nonzero`), in the forward or the
backward of Elastic-Softmax rows and Elastic attention, scalar and per-head parameters,
with and without a key mask (docs/dispatch.md).

Without a GPU the CUDA path runs on CPU tensors: ELASTICBENCH_IMPLEMENTATION=triton forces
the Triton implementation, whose kernels run in Triton's interpreter (this module re-runs
itself with TRITON_INTERPRET=1), while a dispatch mode records every aten op of the call.
On a GPU the same test runs on CUDA tensors and also counts device-to-host copies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elasticbench import devices

pytestmark = pytest.mark.needs("triton")

# ops that return a device value to the host, or whose output shape depends on the data
# (the host waits for the device to know it)
HOST_READS = {"aten._local_scalar_dense", "aten.is_nonzero", "aten.item", "aten.nonzero",
              "aten.masked_select", "aten.equal", "aten.allclose", "aten._unique2",
              "aten.unique_consecutive", "aten.repeat_interleave"}


class HostReads(TorchDispatchMode):
    """Counts the aten ops of HOST_READS, and copies from a CUDA tensor to the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in HOST_READS:
            self.reads[name] += 1
        out = func(*args, **(kwargs or {}))
        if name in ("aten.copy_", "aten._to_copy", "aten.to"):
            src = args[1] if name == "aten.copy_" else args[0]
            dst = args[0] if name == "aten.copy_" else out
            if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and (
                    src.is_cuda and not dst.is_cuda):
                self.reads["device-to-host copy"] += 1
        return out


if not devices.triton_interpreted() and not devices.has_gpu():

    @pytest.mark.ci  # 25-50 s of a core: make test kept under 5 minutes on 2 cores
    def test_no_host_reads_under_the_interpreter(under_interpreter) -> None:
        under_interpreter(__file__)

else:
    from elasticbench import dispatch
    from elasticbench import functional as F
    from elasticbench.attention import autograd
    from elasticbench.nn import ElasticAttention, ElasticSoftmax
    from elasticbench.rows import tiers
    from elasticbench.rows.spec import ELASTIC

    DEVICE = "cuda" if devices.has_gpu() and not devices.triton_interpreted() else "cpu"

    @pytest.fixture(autouse=True)
    def _triton() -> Iterator[None]:
        with dispatch.forcing("triton"):
            yield

    def _gen(seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    def _call_counting(fn, *inputs: torch.Tensor) -> Counter[str]:
        """fn's forward and backward (once warm, so that one-time set-up is not counted),
        inside HostReads; the reads it counted."""
        fn(*inputs).sum().backward()
        with HostReads() as mode:
            out = fn(*inputs)
            out.backward(torch.ones_like(out))
        return mode.reads

    @pytest.mark.parametrize(("params", "dtype"), [
        ("floats", torch.float32), ("scalar", torch.float32), ("per_head", torch.bfloat16),
        ("module", torch.float32), ("module", torch.bfloat16)])
    def test_rows_read_nothing_back(params: str, dtype: torch.dtype) -> None:
        x = (torch.randn(2, 3, 4, 40, generator=_gen(0)) * 3).to(DEVICE, dtype)
        x[0, 0, 0, 3] = float("inf")  # a special row costs no read either
        x[1, 2, 3, 5] = float("nan")
        x.requires_grad_()
        if params == "module":
            module = ElasticSoftmax(tau=0.7, beta=0.3, param_shape=(3, 1, 1)).to(DEVICE)
            fn = module
        elif params == "floats":
            def fn(t):
                return F.elastic_softmax(t, 0.7, 0.3)
        else:
            shape = () if params == "scalar" else (3, 1, 1)
            tau = torch.full(shape, 0.7, device=DEVICE, requires_grad=True)
            beta = torch.full(shape, 0.3, device=DEVICE, requires_grad=True)

            def fn(t):
                return F.elastic_softmax(t, tau, beta)
        assert tiers.choose(x, ELASTIC).name == "triton"
        assert _call_counting(fn, x) == Counter()

    @pytest.mark.parametrize(("params", "masked", "dtype"), [
        ("floats", False, torch.float32), ("per_head", True, torch.float32),
        ("module", False, torch.bfloat16), ("module", True, torch.bfloat16)])
    def test_attention_reads_nothing_back(params: str, masked: bool, dtype: torch.dtype) -> None:
        q, k, v = (torch.randn(2, 3, 24, 16, generator=_gen(i)).to(DEVICE, dtype)
                   .requires_grad_() for i in range(3))
        with torch.no_grad():
            q[0, 1, 5, 0] = float("inf")  # a +inf score: finished in the kernels' own loop
        mask = None
        if masked:
            mask = torch.ones(2, 1, 1, 24, dtype=torch.bool, device=DEVICE)
            mask[1, ..., 17:] = False
        if params == "module":
            fn = ElasticAttention(tau=0.8, beta=0.5, param_shape=(3,), causal=True).to(DEVICE)
            call = lambda q, k, v: fn(q, k, v, attn_mask=mask)  # noqa: E731
        elif params == "floats":
            call = lambda q, k, v: F.elastic_attention(  # noqa: E731
                q, k, v, tau=0.8, beta=0.5, attn_mask=mask)
        else:
            tau = torch.full((3,), 0.8, device=DEVICE, requires_grad=True)
            beta = torch.full((3,), 0.5, device=DEVICE, requires_grad=True)
            call = lambda q, k, v: F.elastic_attention(  # noqa: E731
                q, k, v, tau=tau, beta=beta, causal=True, attn_mask=mask)
        assert autograd.choose(q).name == "triton"
        assert _call_counting(call, q, k, v) == Counter()

    def test_the_count_sees_a_host_read() -> None:
        """The mode counts what it is meant to: a read the library must not make."""
        x = torch.ones(3, device=DEVICE)
        with HostReads() as mode:
            float(x.sum())
            bool((x > 0).any())
            x.nonzero()
        assert mode.reads["aten._local_scalar_dense"] == 2 and mode.reads["aten.nonzero"] == 1
