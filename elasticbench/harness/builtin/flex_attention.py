"""FlexAttention's composition of Elastic attention as an attention kernel: `flex_attention`.

The anchor beside the project's own kernels (docs/attention.md section 6): Elastic attention
written with torch's `flex_attention` as a user would write it (examples/flex_elastic.py),
registered under the attention contract (docs/attention.md section 4) on the backend
`flex_attention` (elasticbench/harness/backends.py), forward and backward (gradients through
autograd, dtau and dbeta included), causal and with a key-padding mask. It is a baseline,
a reference point that is not the project's (as `sdpa`): verify checks it when named with
--only, selftest leaves it out, and `run` times it where a case lists it.

    score_mod(s) = -inf where s < 0, else s / tau[b, h]      (a NaN score stays NaN)
    out_soft, lse = flex_attention(q, k, v, score_mod, block_mask, return lse)
    out = out_soft * Z / (Z + beta) = out_soft / (1 + beta exp(-lse))

since out_soft is the softmax over the kept keys and lse = log Z. Kept scores are >= 0, so a
query that keeps a key has Z >= 1 and exp(-lse) <= 1: the gate never overflows and needs no
log(beta), so beta = 0 is exact (gate 1) and has a finite gradient (via log(beta) it would
give 0 x inf = NaN). A query that keeps nothing gets lse = -inf and out_soft = 0 from
FlexAttention; its gate is set to 0 without evaluating exp(+inf), so its output and
gradients are exactly 0 for every beta.

Special values (docs/attention.md section 3). A query whose visible scores hold a NaN or
+inf has a NaN or +inf lse (exp(inf - inf) is NaN inside the kernel); no other query does.
Those queries are recomputed by the exact composite (elasticbench.attention.composite) on
their own rows, which gives NaN, or the mean of the +inf keys' values, as the policy says;
in the backward FlexAttention is called again with those queries zeroed, so that their NaN
statistics reach no other gradient. Finding them reads one bool back to the host per call
(on CUDA a synchronisation, microseconds beside a millisecond call).

The backward's dtau. Autograd through `s / tau` sums -ds s/tau^2, terms that cancel (1e4
at tau = 0.01, fp64 off by several times the result); the backward kernel therefore runs
the composition shifted by each query's largest kept score (`elastic`, shifted=True), the
same function with dtau summed as docs/attention.md section 2 does.

Where it runs. On CUDA the composition is compiled by torch.compile (FlexAttention is fused
only compiled), once per shape, with recompilation past dynamo's limit made an error rather
than the silent eager fallback. On the CPU, torch 2.13's flex_attention runs eagerly (its
unfused dense path, O(L^2) memory: for checking the composition, not for speed); its
backward is refused there by torch, so the backward kernel declines CPU tensors with that
reason unless $ELASTICBENCH_FLEX_CPU_BACKWARD=1 lifts torch's guard for the dense path (its
gradients are then verified like any kernel's). The BlockMask (causal and key padding) is
built once per (lengths, causal, mask tensor) and reused, as a user builds it once per batch.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from elasticbench.attention.composite import elastic_attention_composite
from elasticbench.harness.backends import FLEX_CPU_BACKWARD_ENV
from elasticbench.harness.builtin.attention_family import autograd_step
from elasticbench.harness.kernel_spec import register_kernel
from elasticbench.settings import settings

RECOMPILE_LIMIT = 1024  # compiled shapes per process before recompiling becomes an error
_MASKS: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()  # key -> (key_mask, BlockMask)
_MASKS_KEPT = 16
_COMPILED: dict[str, Callable] = {}


def flex_module() -> Any:
    """torch.nn.attention.flex_attention (the backend is unavailable where it is missing)."""
    from torch.nn.attention import flex_attention as module

    return module


def _flex_call(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               score_mod: Callable, block_mask: Any, scale: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """flex_attention's (out, lse), through return_aux where torch has it (return_lse is
    deprecated there), else return_lse."""
    if hasattr(module, "AuxRequest"):
        out, aux = module.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                         scale=scale, return_aux=module.AuxRequest(lse=True))
        return out, aux.lse
    return module.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                 scale=scale, return_lse=True)


def composition(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
                beta: torch.Tensor, block_mask: Any, scale: float,
                shift: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): Elastic attention through flex_attention, tau and beta (batch, heads).
    shift (batch, heads, length_q), a constant (no gradient), is taken off each query's kept
    scores inside score_mod and added back to lse/tau outside it: the same function, whose
    gradient in tau is then summed in the shifted form (see `elastic`). What torch.compile
    compiles on CUDA (score_mod and the gate traced with it)."""
    module = flex_module()

    if shift is None:
        def score_mod(score, b, h, q_idx, kv_idx):
            # `s < 0` rather than `s >= 0`: a NaN score must stay NaN, not be dropped
            return torch.where(score < 0, -math.inf, score / tau[b, h])
    else:
        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(score < 0, -math.inf, (score - shift[b, h, q_idx]) / tau[b, h])

    out, lse = _flex_call(module, q, k, v, score_mod, block_mask, scale)
    if shift is not None:
        lse = lse + shift / tau[:, :, None]
    none_kept = lse == -math.inf
    shrink = beta[:, :, None] * torch.exp(-torch.where(none_kept, 0.0, lse))
    gate = 1.0 / (1.0 + shrink)
    # exactly 0 where nothing is kept, even where FlexAttention's 0 weights met a NaN in v
    out = torch.where(none_kept[..., None], 0.0, out.to(gate.dtype) * gate[..., None])
    return out.to(q.dtype), lse


def _compiled() -> Callable:
    """torch.compile(composition), made once per process."""
    if "composition" not in _COMPILED:
        _COMPILED["composition"] = torch.compile(composition, dynamic=False)
    return _COMPILED["composition"]


@contextmanager
def _cpu_backward_allowed(module: Any) -> Iterator[None]:
    """torch's CPU backward guard lifted for the block (the eager dense path underneath
    supports autograd; torch refuses it because its compiled CPU kernel does not)."""
    saved = module._validate_device
    module._validate_device = lambda *args: None
    try:
        yield
    finally:
        module._validate_device = saved


def cpu_backward_refusal() -> str | None:
    """Why the backward cannot run on CPU tensors here, in one line; None where it can
    ($ELASTICBENCH_FLEX_CPU_BACKWARD=1 and a torch whose guard can be lifted)."""
    if not settings().flex_cpu_backward:
        return (f"torch {torch.__version__}'s FlexAttention has no backward on the CPU (eager "
                f"or compiled); run it on CUDA (ELASTICBENCH_TORCH_DEVICE=cuda), or set "
                f"{FLEX_CPU_BACKWARD_ENV}=1 to check its eager dense backward here")
    if not hasattr(flex_module(), "_validate_device"):
        return (f"{FLEX_CPU_BACKWARD_ENV}=1: torch {torch.__version__} has no "
                "flex_attention._validate_device guard to lift")
    return None


def block_mask_for(q: torch.Tensor, k: torch.Tensor, causal: bool,
                   key_mask: torch.Tensor | None) -> Any:
    """The BlockMask of causal masking and key padding (None where every key is visible),
    built once per (lengths, device, causal, mask tensor and its version) and reused."""
    if not causal and key_mask is None:
        return None
    lq, lk = q.shape[2], k.shape[2]
    if key_mask is not None:
        key_mask = key_mask.to(device=q.device, dtype=torch.bool)
        if key_mask.shape != (q.shape[0], lk):
            raise ValueError(f"key_mask must be (batch, length_k) = {(q.shape[0], lk)}, "
                             f"got {tuple(key_mask.shape)}")
    key = (lq, lk, str(q.device), causal,
           None if key_mask is None else (id(key_mask), key_mask._version))
    if key in _MASKS:
        _MASKS.move_to_end(key)
        return _MASKS[key][1]
    keys = key_mask

    def visible(b, h, q_idx, kv_idx):
        seen = q_idx >= kv_idx if causal else kv_idx >= 0
        return seen & keys[b, kv_idx] if keys is not None else seen

    batch = None if key_mask is None else q.shape[0]
    mask = flex_module().create_block_mask(visible, batch, None, lq, lk, device=q.device)
    _MASKS[key] = (key_mask, mask)  # the tensor is held so that its id is not reused
    if len(_MASKS) > _MASKS_KEPT:
        _MASKS.popitem(last=False)
    return mask


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
            beta: torch.Tensor, scale: float, causal: bool, key_mask: torch.Tensor | None,
            shift: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) by the composition: compiled on CUDA, eager elsewhere, dynamo's recompile
    limit raised and its eager fallback made an error."""
    mask = block_mask_for(q, k, causal, key_mask)
    if q.device.type != "cuda":
        return composition(q, k, v, tau, beta, mask, scale, shift)
    with _recompiles_allowed():
        return _compiled()(q, k, v, tau, beta, mask, scale, shift)


def _recompiles_allowed() -> AbstractContextManager[Any]:
    """dynamo's recompile limits raised to RECOMPILE_LIMIT for the block, and hitting them an
    error rather than the silent eager fallback (whichever of the settings this torch has)."""
    import torch._dynamo.config as config

    settings: dict[str, Any] = {}
    for new, old in (("recompile_limit", "cache_size_limit"),  # old: torch < 2.6's names
                     ("accumulated_recompile_limit", "accumulated_cache_size_limit")):
        name = new if hasattr(config, new) else old
        settings[name] = max(RECOMPILE_LIMIT, getattr(config, name))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        settings["fail_on_recompile_limit_hit"] = True
    return config.patch(**settings)


def kept_max(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, lse) of each query's kept scores themselves, no tau: m their largest (-inf where
    none is kept), lse NaN or +inf where a visible score is. What torch.compile compiles on
    CUDA for the shift of `elastic`."""
    module = flex_module()

    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(score < 0, -math.inf, score)

    _, aux = module.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                   scale=scale,
                                   return_aux=module.AuxRequest(lse=True, max_scores=True))
    return aux.max_scores, aux.lse


def _kept_max(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
              scale: float, causal: bool, key_mask: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """kept_max, compiled, on CUDA; where this torch's flex_attention returns no max_scores,
    tau lse of the composition instead (within tau log(length_k) of m: the cancellation is
    then left at the rounding of that product). Off CUDA, _dense_kept_max."""
    if q.device.type != "cuda":
        return _dense_kept_max(q, k, scale, causal, key_mask)
    mask = block_mask_for(q, k, causal, key_mask)
    if "max_scores" in getattr(flex_module(), "AuxRequest", tuple)._fields:
        if "kept_max" not in _COMPILED:
            _COMPILED["kept_max"] = torch.compile(kept_max, dynamic=False)
        try:
            with _recompiles_allowed():
                return _COMPILED["kept_max"](q, k, v, mask, scale)
        except Exception as e:  # said, not hidden: verify's records keep the warning
            warnings.warn(f"flex_attention: max_scores failed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); shifting by tau "
                          "lse instead", RuntimeWarning, stacklevel=2)
    lse = _attend(q, k, v, tau, torch.ones_like(tau), scale, causal, key_mask)[1]
    return lse * tau[:, :, None], lse


def _dense_kept_max(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool,
                    key_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """kept_max off CUDA, where flex_attention returns no max_scores: the scores as
    FlexAttention's eager dense path forms them (the same operations, so the same values)."""
    wd = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q.to(wd) @ k.to(wd).transpose(-2, -1)) * scale
    hidden = s < 0
    if causal:
        lq, lk = s.shape[-2:]
        hidden = hidden | (torch.arange(lk, device=s.device)[None, :]
                           > torch.arange(lq, device=s.device)[:, None])
    if key_mask is not None:
        hidden = hidden | ~key_mask.to(device=s.device, dtype=torch.bool)[:, None, None, :]
    s = s.masked_fill(hidden, -math.inf)
    return s.amax(-1), torch.logsumexp(s, -1)


def special_queries(lse: torch.Tensor) -> torch.Tensor | None:
    """(n, 3) indices (batch, head, query) of the queries whose visible scores hold a NaN or
    +inf (their lse is NaN or +inf), or None: the one read back to the host."""
    bad = lse.isnan() | (lse == math.inf)
    if not bool(bad.any()):
        return None
    return bad.nonzero()


def _exact_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
                beta: torch.Tensor, scale: float, causal: bool, key_mask: torch.Tensor | None,
                idx: torch.Tensor) -> torch.Tensor:
    """The queries idx (n, 3) by the exact composite, (n, value_dim), differentiable."""
    b, h, i = idx.unbind(1)
    seen = torch.ones(idx.shape[0], k.shape[2], dtype=torch.bool, device=q.device)
    if causal:
        seen &= torch.arange(k.shape[2], device=q.device)[None, :] <= i[:, None]
    if key_mask is not None:
        seen &= key_mask.to(device=q.device, dtype=torch.bool)[b]
    rows = elastic_attention_composite(
        q[b, h, i][:, None, None, :], k[b, h][:, None], v[b, h][:, None],
        tau=tau[b, h][:, None, None, None], beta=beta[b, h][:, None, None, None],
        scale=scale, causal=False, attn_mask=seen[:, None, None, :])
    return rows[:, 0, 0, :]


def elastic(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
            beta: torch.Tensor, scale: float, causal: bool, key_mask: torch.Tensor | None,
            *, shifted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of Elastic attention with the special queries recomputed exactly;
    differentiable in q, k, v, tau and beta where the tensors require grad.

    shifted=True (for gradients) first finds each query's largest kept score m (`kept_max`,
    without a graph), then runs the composition with score_mod (s - m)/tau and lse + m/tau.
    Unshifted, autograd sums dtau as -sum ds s/tau^2, whose terms (s/tau^2 ~ 1e4 at tau =
    0.01) cancel to a small result: verify measured dtau off by several times its value there,
    in fp64. Shifted, the terms are -ds (s - m)/tau^2, 0 at the largest score, and m's own
    share, -dlse m/tau^2, is one term a query, as docs/attention.md section 2 sums dtau. The
    forward is the same function either way.
    """
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, tau, beta))
    shift = None
    if shifted:
        with torch.no_grad():
            shift, lse0 = _kept_max(q, k, v, tau, scale, causal, key_mask)
        idx = special_queries(lse0)
        shift = torch.where(shift.isfinite(), shift, 0.0)
    else:
        out, lse = _attend(q, k, v, tau, beta, scale, causal, key_mask)
        idx = special_queries(lse.detach())
        if idx is None:
            return out, lse
    if shifted or grads:
        if idx is not None:
            # their NaN statistics would reach other keys' gradients through FlexAttention's
            # backward (NaN x 0): they are zeroed for it and taken from the composite alone
            live = torch.ones(q.shape[:3], dtype=torch.bool, device=q.device)
            live[tuple(idx.unbind(1))] = False
            q_flex = torch.where(live[..., None], q, 0)
        else:
            q_flex = q
        out, lse = _attend(q_flex, k, v, tau, beta, scale, causal, key_mask, shift)
    if idx is None:
        return out, lse
    rows = _exact_rows(q, k, v, tau, beta, scale, causal, key_mask, idx)
    return out.index_put(tuple(idx.unbind(1)), rows.to(out.dtype)), lse


def _check_device(q: torch.Tensor, backward: bool) -> None:
    """Refuse (one line) what cannot run here: the backward on CPU tensors, unless allowed."""
    if backward and q.device.type == "cpu" and (why := cpu_backward_refusal()):
        raise NotImplementedError(f"flex_attention backward: {why}")


@register_kernel(function="elastic_attention", backend="flex_attention",
                 name="flex_attention", baseline=True)
def flex_attention(q, k, v, *, tau, beta, scale, causal, key_mask=None):
    """FlexAttention's composition: score_mod where(s < 0, -inf, s/tau), lse, a gate."""
    _check_device(q, backward=False)
    return elastic(q, k, v, tau, beta, scale, causal, key_mask)[0]


@register_kernel(function="elastic_attention", backend="flex_attention", mode="bwd",
                 name="flex_attention", baseline=True)
def flex_attention_bwd(q, k, v, *, tau, beta, scale, causal, key_mask=None):
    """The composition's gradients through autograd (FlexAttention's own backward)."""
    _check_device(q, backward=True)
    module = flex_module()
    lifted = q.device.type == "cpu"  # only reached when cpu_backward_refusal() is None
    return autograd_step(lambda *t: elastic(*t, scale, causal, key_mask, shifted=True)[0],
                         (q, k, v, tau, beta),
                         (lambda: _cpu_backward_allowed(module)) if lifted else nullcontext)


flex_attention_bwd.second_order = "no"  # FlexAttention has no double backward
