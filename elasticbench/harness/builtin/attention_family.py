"""The attention family's kernels, registered from one table: which kernel each
implementation registers for each attention function, and the glue between them, once.

The family (elastic, softmax1, symax, stablemax, sigmoid and cog attention;
docs/attention.md section 9) is computed by four implementations: the eager composite and the tiled torch
code (elasticbench/harness/builtin/torch_attention.py), the native fused kernel (elasticbench/harness/builtin/cpp_attention.py) and
the Triton kernel (elasticbench/harness/builtin/triton_attention.py). `FAMILY` has one row per attention
function: which of the fused kernels' two parameter slots (p_score, p_den of
elasticbench/attention/weights.py) each of its row parameters fills, and, per
implementation, the descriptions of its forward and backward kernel. Each registering
module describes its implementation (`Implementation`) and calls `register_family`, which
registers, for every function the table gives that implementation, a forward and a
backward kernel under the attention contract (docs/attention.md section 4), named

    <prefix>_attention<suffix>       for elastic_attention       (cpp_attention, ...)
    <prefix>_<f>_attention<suffix>   for each other f_attention  (cpp_symax_attention, ...)

Each kernel function is a function of the registering module (its __module__, and an
attribute of it: `<name>` and `<name>_bwd`) with the signature the contract reads,
`(q, k, v, *, <row params>, scale, causal, <mask>=None, gate=None)`: `gate`, where the
implementation takes one (its forward has a `gate` parameter; the composites always, by
autograd through out * gate), so verify gives the kernel gated cases: the forward returns
out * gate, and the backward's step(dY) returns d gate after the other gradients (the fused
ones by the weights' contract: the ungated backward at out = ungated, dout = dY * gate, and
d gate = dY * ungated). This module registers nothing itself. `autograd_step` is the backward of every kernel whose gradients are autograd's
(the composites, SDPA, FlexAttention).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from elasticbench.attention.weights import Weight
from elasticbench.harness.functions import get_attention_function
from elasticbench.harness.kernel_spec import MODES, register_kernel

Tensor = torch.Tensor
Step = Callable[[Tensor], tuple[Tensor, ...]]


def autograd_step(forward: Callable[..., Tensor], tensors: Iterable[Tensor],
                  during: Callable[[], AbstractContextManager[Any]] = nullcontext) -> Step:
    """A backward kernel's first call by autograd: forward(*leaves) now, with grad enabled,
    on detached copies of `tensors` that require grad; then step(dout) -> the gradient of
    every leaf, in order. `during()` is entered around the forward and around each step
    (an SDPA backend pinned, a guard lifted)."""
    leaves = [t.detach().requires_grad_() for t in tensors]
    with torch.enable_grad(), during():
        out = forward(*leaves)

    def step(dout: Tensor) -> tuple[Tensor, ...]:
        with during():
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return step


@dataclass(frozen=True)
class Implementation:
    """One implementation of the whole family, as a registering module hands it over.

    forward(q, k, v, p_score, p_den, scale, causal, mask, weight) computes the attention of
    `weight` (its output, or a tuple whose first element is). A fused implementation also
    has backward(q, k, v, out, dout, m, den, p_score, p_den, scale, causal, mask, weight)
    -> (dq, dk, dv, dp_score, dp_den), from the (out, m, den) its forward returns, and is
    given both slots as (batch, heads) tensors, zeros in a slot its weight does not use
    (attention/weights.py). Without a backward, the gradients are autograd's through the
    forward, which is then given None in a slot the function does not use."""

    key: str  # its column in FAMILY's rows
    backend: str
    prefix: str  # kernel names: <prefix>_[<f>_]attention<suffix>
    forward: Callable[..., Any]
    backward: Callable[..., tuple[Tensor, ...]] | None = None
    suffix: str = ""
    mask: str = "key_mask"  # the mask keyword its kernels take: key_mask or attn_mask
    dtypes: tuple[str, ...] | None = None  # the formats it takes (register_kernel's)

    @property
    def gated(self) -> bool:
        """Whether its kernels take a gate: the forward of a fused implementation declares
        `gate` (the weights' contract); a composite's is applied here, under autograd."""
        if self.backward is None:
            return True
        try:
            return "gate" in inspect.signature(self.forward).parameters
        except (TypeError, ValueError):
            return False


@dataclass(frozen=True)
class Member:
    """One attention function of the family: the row parameter in each slot of the fused
    kernels (None: the slot is unused), and the descriptions, (forward, backward), of the
    kernel each implementation (by key) registers for it."""

    function: str
    p_score: str | None = None
    p_den: str | None = None
    kernels: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def weight(self) -> Weight:
        """The fused weight, as the function's definition names it
        (functions/attention_functions.py)."""
        return Weight[get_attention_function(self.function).weight]

    @property
    def params(self) -> tuple[str, ...]:
        """Its row parameters, in the kernels' signature order (p_score's, then p_den's)."""
        return tuple(p for p in (self.p_score, self.p_den) if p is not None)

    def name(self, impl: Implementation) -> str:
        """The kernel name impl registers for this function."""
        return f"{impl.prefix}_{self.function.removeprefix('elastic_')}{impl.suffix}"


FAMILY: tuple[Member, ...] = (
    Member("elastic_attention", p_score="tau", p_den="beta", kernels={
        "composite": (
            "The eager composite: the whole score matrix, elastic_softmax, weights @ v.",
            "The composite's gradients through autograd (Elastic-Softmax's own backward)."),
        "flash": (
            "Tiled torch: online max and sum over kept scores, O(length) extra memory.",
            "Tiled torch backward from the forward's two statistics per query."),
        "cpp": (
            "Fused forward: (out, m, den), out in q's dtype; key_mask hides padded keys.",
            "Fused forward (untimed), then step(dout): the backward from its two statistics."),
        "triton": (
            "Elastic attention in Triton: flash tiles, online max and sum over kept scores.",
            "Triton backward from the forward's statistics: dk, dv per key block, dq per "
            "query block."),
    }),
    Member("softmax1_attention", kernels={
        "composite": (
            "The eager composite: the whole score matrix, softmax1, weights @ v.",
            "The composite's gradients through autograd."),
        "flash": (
            "Tiled torch: online max (floored at 0) and sum, the 1 rescaled, O(length) memory.",
            "Tiled torch backward from the forward's two statistics per query."),
        "cpp": (
            "Fused forward: online max (floored at 0, the 1's exponent) and sum; (out, m, den).",
            "Fused forward (untimed), then step(dout): the backward from its two statistics."),
        "triton": (
            "softmax1 in Triton: Elastic's tiles at tau = 1, beta = 1, keeping every score.",
            "Forward (untimed), then step(dout) -> (dq, dk, dv)."),
    }),
    Member("symax_attention", p_den="eta", kernels={
        "composite": (
            "The eager composite: the whole score matrix, |s| / (eta + sum |s|), weights @ v.",
            "The composite's gradients through autograd (deta included)."),
        "flash": (
            "Tiled torch: plain running sums of |s| and |s| v, / (eta + sum) at the end.",
            "Tiled torch backward (deta = -sum_i rowsum(dO out)_i / den_i)."),
        "cpp": (
            "Fused forward: running sums of |s| and |s| v, / (eta + sum) at the end.",
            "Fused forward (untimed), then step(dout) -> (dq, dk, dv, deta)."),
        "triton": (
            "symax in Triton: running sums of |s| and |s| v, / (eta + sum) at the end.",
            "Forward (untimed), then step(dout) -> (dq, dk, dv, deta)."),
    }),
    Member("stablemax_attention", kernels={
        "composite": (
            "The eager composite: the whole score matrix, stablemax, weights @ v.",
            "The composite's gradients through autograd."),
        "flash": (
            "Tiled torch: plain running sums of st(s) and st(s) v, normalized at the end.",
            "Tiled torch backward from the forward's denominators."),
        "cpp": (
            "Fused forward: running sums of st(s) and st(s) v, normalized at the end.",
            "Fused forward (untimed), then step(dout): the backward from its denominators."),
        "triton": (
            "stablemax in Triton: running sums of st(s) and st(s) v, normalized at the end.",
            "Forward (untimed), then step(dout) -> (dq, dk, dv)."),
    }),
    Member("cog_attention", kernels={
        "composite": (
            "The eager composite: the whole score matrix, sign(s) softmax(|s|), weights @ v.",
            "The composite's gradients through autograd (p g at a zero score)."),
        "flash": (
            "Tiled torch: online max of |s| and sum, weights signed before the product.",
            "Tiled torch backward from the forward's two statistics: ds = p g - w c."),
        "cpp": (
            "Fused forward: online max of |s| and sum, signed weights; (out, m, den).",
            "Fused forward (untimed), then step(dout): the backward from its two statistics."),
        "triton": (
            "cog attention in Triton: online max of |s| and sum, weights signed.",
            "Forward (untimed), then step(dout) -> (dq, dk, dv)."),
    }),
    Member("sigmoid_attention", p_score="bias", kernels={
        "composite": (
            "The eager composite: the whole score matrix, sigmoid(s + bias), weights @ v.",
            "The composite's gradients through autograd (dbias included)."),
        "flash": (
            "Tiled torch: sum of sigmoid(s + bias) v, no normalizer.",
            "Tiled torch backward (ds = g y (1 - y), dbias = sum ds)."),
        "cpp": (
            "Fused forward: the sum of sigmoid(s + bias) v, no normalizer.",
            "Fused forward (untimed), then step(dout) -> (dq, dk, dv, dbias)."),
        "triton": (
            "sigmoid attention in Triton: the sum of sigmoid(s + bias) v, no normalizer.",
            "Forward (untimed), then step(dout) -> (dq, dk, dv, dbias)."),
    }),
)

FUNCTIONS = tuple(m.function for m in FAMILY)


def register_family(impl: Implementation, namespace: dict[str, Any],
                    functions: Sequence[str] = FUNCTIONS) -> None:
    """Register impl's forward and backward kernel for each of `functions` that FAMILY
    gives impl, in that order (the registry's, which `elasticbench list` shows). namespace
    is the calling module's globals(): each kernel function becomes an attribute of that
    module and names it as its own, so that it pickles by reference and the module that
    registered it can be found from it (verify's lanes, `gate ab --rev`)."""
    members = {m.function: m for m in FAMILY}
    for function in functions:
        member = members[function]
        if impl.key not in member.kernels:
            continue
        name = member.name(impl)
        for mode, doc in zip(MODES, member.kernels[impl.key], strict=True):
            fn = _kernel(member, impl, mode)
            fn.__name__ = fn.__qualname__ = name if mode == "fwd" else f"{name}_bwd"
            fn.__module__ = namespace["__name__"]
            fn.__doc__ = doc
            fn.__signature__ = _signature(member, impl.mask,  # type: ignore[attr-defined]
                                          impl.gated)
            namespace[fn.__name__] = fn
            register_kernel(function=function, backend=impl.backend, name=name, mode=mode,
                            dtypes=impl.dtypes)(fn)


def _signature(member: Member, mask: str, gated: bool) -> inspect.Signature:
    """(q, k, v, *, <row params>, scale, causal, <mask>=None[, gate=None]): what the
    contract reads."""
    P = inspect.Parameter
    tensors = [P(n, P.POSITIONAL_OR_KEYWORD, annotation=Tensor) for n in ("q", "k", "v")]
    keywords = [P(n, P.KEYWORD_ONLY, annotation=Tensor) for n in member.params]
    keywords += [P("scale", P.KEYWORD_ONLY, annotation=float),
                 P("causal", P.KEYWORD_ONLY, annotation=bool),
                 P(mask, P.KEYWORD_ONLY, default=None, annotation=Tensor | None)]
    if gated:
        keywords.append(P("gate", P.KEYWORD_ONLY, default=None, annotation=Tensor | None))
    return inspect.Signature(tensors + keywords)


def _keywords(member: Member, mask: str, gated: bool
              ) -> Callable[[dict[str, Any], str], tuple[Any, Any, Any, Any]]:
    """take(kw, fname) -> (p_score, p_den, mask, gate) from a kernel call's keywords (None
    for a slot the function does not use, no mask, no gate); TypeError, as Python words it,
    for a row parameter missing or a keyword the kernel does not take. What can be is worked
    out here, once."""
    p_score, p_den, params = member.p_score, member.p_den, member.params
    allowed = frozenset((*params, mask, *(("gate",) if gated else ())))

    def take(kw: dict[str, Any], fname: str) -> tuple[Any, Any, Any, Any]:
        if not allowed.issuperset(kw):
            unknown = sorted(set(kw) - allowed)[0]
            raise TypeError(f"{fname}() got an unexpected keyword argument {unknown!r}")
        try:
            return (None if p_score is None else kw[p_score],
                    None if p_den is None else kw[p_den], kw.get(mask), kw.get("gate"))
        except KeyError as e:
            raise TypeError(f"{fname}() missing 1 required keyword-only argument: "
                            f"{e.args[0]!r}") from None
    return take


def _zeros_for(q: Tensor, p_score: Tensor | None, p_den: Tensor | None
               ) -> tuple[Tensor, Tensor]:
    """(p_score, p_den) for a fused kernel: an absent one as zeros of the given one's shape,
    or (batch, heads) zeros in the working precision on q's device when neither is given."""
    if p_score is not None and p_den is not None:
        return p_score, p_den
    given = p_score if p_score is not None else p_den
    if given is None:
        zero = torch.zeros(q.shape[:2], device=q.device,
                           dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    else:
        zero = torch.zeros_like(given)
    return (zero if p_score is None else p_score), (zero if p_den is None else p_den)


def _kernel(member: Member, impl: Implementation, mode: str) -> Callable[..., Any]:
    """The kernel function of (member, impl, mode), under the attention contract: the
    forward returns impl's output; the backward runs the forward and returns step(dout) ->
    (dq, dk, dv, *the row parameters' gradients, in signature order)."""
    weight, backward = member.weight, impl.backward
    take = _keywords(member, impl.mask, impl.gated)

    def forward(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool,
                **kw: Any) -> Any:
        p_score, p_den, mask, gate = take(kw, forward.__name__)
        if backward is None:  # a composite: the gate applied to its output
            out = impl.forward(q, k, v, p_score, p_den, scale, causal, mask, weight)
            return out if gate is None else out * gate
        p_score, p_den = _zeros_for(q, p_score, p_den)
        gated = {} if gate is None else {"gate": gate}
        return impl.forward(q, k, v, p_score, p_den, scale, causal, mask, weight, **gated)

    def autograd_backward(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool,
                          **kw: Any) -> Step:
        p_score, p_den, mask, gate = take(kw, autograd_backward.__name__)

        def differentiable(q: Tensor, k: Tensor, v: Tensor, *params: Tensor) -> Any:
            leaf = iter(params)  # the leaves of the used slots, in order (the gate last)
            out = impl.forward(q, k, v, None if p_score is None else next(leaf),
                               None if p_den is None else next(leaf), scale, causal, mask,
                               weight)
            return out if gate is None else out * next(leaf)
        return autograd_step(differentiable, (q, k, v, *_used(p_score, p_den),
                                              *(() if gate is None else (gate,))))

    def fused_backward(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool,
                       **kw: Any) -> Step:
        p_score, p_den, mask, gate = take(kw, fused_backward.__name__)
        score_slot, den_slot = _zeros_for(q, p_score, p_den)
        if gate is None:
            out, m, den = impl.forward(q, k, v, score_slot, den_slot, scale, causal, mask,
                                       weight)[:3]
            ungated = out
        else:  # the weights' contract: the ungated output kept for the backward
            _, m, den, ungated = impl.forward(q, k, v, score_slot, den_slot, scale, causal,
                                              mask, weight, gate=gate, keep_ungated=True)

        def step(dout: Tensor) -> tuple[Tensor, ...]:
            do = dout if gate is None else dout * gate
            dq, dk, dv, dp_score, dp_den = backward(q, k, v, ungated, do, m, den, score_slot,
                                                    den_slot, scale, causal, mask, weight)
            grads = (dq, dk, dv, *_used(None if p_score is None else dp_score,
                                        None if p_den is None else dp_den))
            return grads if gate is None else (*grads, dout * ungated)
        return step

    if mode == "fwd":
        return forward
    return autograd_backward if backward is None else fused_backward


def _used(p_score: Any, p_den: Any) -> tuple[Any, ...]:
    """What stands in the used slots (not None), p_score's first."""
    return tuple(p for p in (p_score, p_den) if p is not None)


__all__ = ["FAMILY", "FUNCTIONS", "Implementation", "Member", "autograd_step",
           "register_family"]
