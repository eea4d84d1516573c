"""Native C++ kernels (backend `cpp`): the whole family forward, the exp family backward.

The sources are kernels/cpp (vectorized once per instruction set, picked at run time; rows
over torch's threads; few long rows split across threads in two phases); elasticbench.native
builds them through torch's extension API. docs/native.md describes the pass structures:

| kernel                  | sweeps over memory                                   | R | W | exps |
|-------------------------|------------------------------------------------------|---|---|------|
| cpp_elastic_three_pass  | max | sum exp | exp, scale                           | 3 | 1 | 2 |
| cpp_elastic_online      | block max + rescaled sum | exp, scale                | 2 | 1 | 2 |
| cpp_elastic (fused)     | block max + sum, exps stored in y | y rescaled by block | 2 | 2 | 1 |
| cpp_elastic_accurate    | online in fp64 (<= 1 ulp in fp32)                    | 2 | 1 | 2 (fp64) |

The fused kernel keeps its exps in y for fp64/fp32; a 16-bit y would round them, so for
fp16/bf16 they go to a per-thread fp32 row buffer. Special values follow docs/definitions.md section 3.
"""

from __future__ import annotations

import math

import torch

from elasticbench.harness.kernel_spec import register_kernel
from elasticbench.harness.passes import PassModel
from elasticbench.native import load

_ext = load()
Structure = _ext.Structure  # the pass structures of kernels/cpp/table.h


def _elastic(x: torch.Tensor, structure: object, tau: float, beta: float) -> torch.Tensor:
    return _ext.exp_forward(x, structure, True, -math.inf, float(tau), float(beta))


@register_kernel(function="elastic", backend="cpp", name="cpp_elastic",
                 model=PassModel("fused", reads=2, writes=2, exps=1))
def cpp_elastic(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Native Elastic-Softmax, fused: one exponential per element, y rescaled in cache."""
    return _elastic(x, Structure.FUSED, tau, beta)


@register_kernel(function="elastic", backend="cpp", name="cpp_elastic_online",
                 model=PassModel("online", reads=2, writes=1, exps=2))
def cpp_elastic_online(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Native Elastic-Softmax, online: block max and rescaled sum in one sweep, then write."""
    return _elastic(x, Structure.ONLINE, tau, beta)


@register_kernel(function="elastic", backend="cpp", name="cpp_elastic_three_pass",
                 model=PassModel("three-pass", reads=3, writes=1, exps=2))
def cpp_elastic_three_pass(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Native Elastic-Softmax, three sweeps: max, sum of exps, write."""
    return _elastic(x, Structure.THREE_PASS, tau, beta)


@register_kernel(function="elastic", backend="cpp", name="cpp_elastic_accurate",
                 dtypes=("fp64", "fp32"),
                 model=PassModel("online", reads=2, writes=1, exps=2, compute="fp64"))
def cpp_elastic_accurate(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """Native Elastic-Softmax computed in fp64 and rounded once: <= 1 ulp in fp32."""
    return _elastic(x, Structure.ACCURATE, tau, beta)


@register_kernel(function="softmax", backend="cpp", name="cpp_softmax",
                 model=PassModel("fused", reads=2, writes=2, exps=1))
def cpp_softmax(x: torch.Tensor) -> torch.Tensor:
    """Native safe softmax (fused); an all -inf row gives zeros."""
    return _ext.exp_forward(x, Structure.FUSED, False, -math.inf, 1.0, 0.0)


@register_kernel(function="softmax1", backend="cpp", name="cpp_softmax1",
                 model=PassModel("fused", reads=2, writes=2, exps=1))
def cpp_softmax1(x: torch.Tensor) -> torch.Tensor:
    """Native softmax1 (fused): shift max(max x, 0), the 1 rescaled to exp(-m)."""
    return _ext.exp_forward(x, Structure.FUSED, False, 0.0, 1.0, 1.0)


@register_kernel(function="stablemax", backend="cpp", name="cpp_stablemax",
                 model=PassModel("two-pass", reads=2, writes=1, exps=0))
def cpp_stablemax(x: torch.Tensor) -> torch.Tensor:
    """Native stablemax: max and sum of weights in one sweep (fp64 sum), then write."""
    return _ext.weight_forward(x, False, 0.0)


@register_kernel(function="symax", backend="cpp", name="cpp_symax",
                 model=PassModel("two-pass", reads=2, writes=1, exps=0))
def cpp_symax(x: torch.Tensor, *, eta: float) -> torch.Tensor:
    """Native symax: |x| / (eta + sum |x|), max and sum in one sweep, then write."""
    return _ext.weight_forward(x, True, float(eta))


# Backward: fn(x, y, g, **params) -> dx (or dx, dtau, dbeta). Two sweeps: c = sum g y and
# max y; then dx from y and g. Elastic's parameter gradients also need x in the first (the
# kept max and the sums of y z' and g y z', in one read); dx alone reads x only for a row
# whose y cannot tell its class (one-hot, tied or NaN: docs/native.md).


@register_kernel(function="elastic", backend="cpp", name="cpp_elastic_bwd", mode="bwd",
                 model=PassModel("two-pass", reads=5, writes=1, exps=0))
def cpp_elastic_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, *, tau: float,
                    beta: float):
    """Native Elastic-Softmax backward: dx, dtau and dbeta."""
    dx, dtau, dbeta = _ext.exp_backward(x, y, g, True, float(tau), float(beta), True)
    return dx, dtau.sum(), dbeta.sum()


@register_kernel(function="softmax", backend="cpp", name="cpp_softmax_bwd", mode="bwd",
                 model=PassModel("two-pass", reads=4, writes=1, exps=0))
def cpp_softmax_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Native softmax backward: y (g - sum g y); zeros on all -inf rows."""
    return _ext.exp_backward(x, y, g, False, 1.0, 0.0, False)[0]


@register_kernel(function="softmax1", backend="cpp", name="cpp_softmax1_bwd", mode="bwd",
                 model=PassModel("two-pass", reads=4, writes=1, exps=0))
def cpp_softmax1_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Native softmax1 backward: y (g - sum g y), as softmax."""
    return _ext.exp_backward(x, y, g, False, 1.0, 1.0, False)[0]
