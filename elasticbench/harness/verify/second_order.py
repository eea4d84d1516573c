"""Whether a backward kernel supports second-order gradients: what it declares, else a probe.

A kernel may declare it as an attribute of its function, `fn.second_order = "yes"` or
`"no"`. Otherwise one cheap probe per kernel answers: the backward is called once in fp64
on a few leaf tensors that require grad (rows: x, y, g; attention: q, k, v, then step(dO)).

- "no": its gradients carry no autograd graph (a fused kernel, NumPy): a second order
  taken through them would be silently 0;
- "yes": they carry one, and torch.autograd.gradcheck of the gradients against their
  inputs (the kernel's gradgradcheck) passes;
- "wrong": they carry one that gradcheck refutes: a second order would be silently wrong;
- kernels of a backend whose kernels are not autograd functions (NumPy, Triton: its
  Backend.autograd is False) answer "no" unprobed; "not probed: ..." says why a torch or
  native kernel could not be probed (no fp64, say).

`verify --mode bwd` puts the answer in every backward record (`second_order`) and a column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from elasticbench.harness.backends import get_backend
from elasticbench.harness.execute import IN_PROCESS, Isolation
from elasticbench.harness.registry import KernelSpec

ANSWERS = ("yes", "no", "wrong")
_CACHE: dict[tuple[str, str, str], str] = {}


def second_order(spec: KernelSpec, isolation: Isolation = IN_PROCESS) -> str:
    """The kernel's answer (declared, or probed once per kernel and cached). Under --isolate
    or --timeout (isolation.active) the kernel never runs in this process: not probed."""
    declared = getattr(spec.fn, "second_order", None)
    if declared in ANSWERS:
        return str(declared)
    if isolation.active and get_backend(spec.backend).autograd:
        return "not probed: --isolate runs kernels in workers only"
    key = (spec.name, spec.mode, spec.source)
    if key not in _CACHE:
        _CACHE[key] = _probe(spec)
    return _CACHE[key]


def _probe(spec: KernelSpec) -> str:
    if not get_backend(spec.backend).autograd:
        return "no"
    if not spec.supports("fp64"):
        return "not probed: the kernel takes no fp64"
    leaves, grads_of = (_attention_call if spec.kind == "attention" else _rows_call)(spec)
    try:
        with torch.enable_grad():
            grads = [g for g in grads_of(*leaves) if isinstance(g, torch.Tensor)]
        if not any(g.requires_grad for g in grads):
            return "no"
        ok = torch.autograd.gradcheck(lambda *a: tuple(_tensors(grads_of(*a))), leaves,
                                      eps=1e-6, atol=1e-5, rtol=1e-4, raise_exception=False)
    except Exception as e:  # a kernel that breaks under the probe: say why
        return f"not probed: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return "yes" if ok else "wrong"


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor) and v.requires_grad]


def _leaf(*shape: int, seed: int, low: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*shape, generator=g, dtype=torch.float64) + low
    return t.requires_grad_()


def _rows_call(spec: KernelSpec) -> tuple[list[torch.Tensor], Callable[..., Sequence[Any]]]:
    """x (kept entries well away from 0, one masked), y > 0, g; fn(x, y, g, **params)."""
    from elasticbench.harness.functions import get_function

    x = _leaf(2, 5, seed=1, low=0.25)
    with torch.no_grad():
        x[:, 0] = -1.0
    y, g = _leaf(2, 5, seed=2, low=0.1), _leaf(2, 5, seed=3, low=-0.5)
    params = {p.name: 0.7 if p.name == "tau" else 0.3 for p in get_function(spec.function).params}

    def grads(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Sequence[Any]:
        out = spec.fn(a, b, c, **params)
        return out if isinstance(out, tuple | list) else (out,)
    return [x, y, g], grads


def _attention_call(spec: KernelSpec
                    ) -> tuple[list[torch.Tensor], Callable[..., Sequence[Any]]]:
    """q, k, v (1, 1, 3, 2) with scores well away from 0; step(dO) of fn(q, k, v, ...)."""
    from elasticbench.harness.functions import get_attention_function

    q, k, v = (_leaf(1, 1, 3, 2, seed=s, low=0.25) for s in (4, 5, 6))
    dout = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64).reshape(1, 1, 3, 2)
    rows = get_attention_function(spec.function).row_params
    params = {n: torch.full((1, 1), 0.7 if n == "tau" else 0.3, dtype=torch.float64)
              for n in rows}

    def grads(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Sequence[Any]:
        return spec.fn(a, b, c, scale=0.5, causal=False, **params)(dout)
    return [q, k, v], grads
