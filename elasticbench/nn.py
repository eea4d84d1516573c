"""torch modules: ElasticSoftmax and ElasticAttention with learnable temperature and offset,
and the family's attention modules (Softmax1Attention, SymaxAttention, StablemaxAttention,
SigmoidAttention, CogAttention; docs/attention.md section 9).

Parametrization (documented contract): with tau0, beta0 the values given at construction,

    tau  = tau0  * exp(log_tau_scale)       log_tau_scale  = 0 at init
    beta = beta0 * exp(log_beta_scale)      log_beta_scale = 0 at init

exp(0) is exactly 1, so the module computes with exactly tau0 and beta0 at init; tau stays
> 0 and beta >= 0 whatever the optimizer does, and both learn on a log scale, which suits
scale parameters spanning orders of magnitude. The trainable tensors are `log_tau_scale`
and `log_beta_scale` (nn.Parameter when learned, buffers when fixed). `learnable` says
whether both are learned; `learn_tau` and `learn_beta`, when given, decide for one each
(learn_beta=False keeps beta fixed, at 0 if asked). A learned beta needs beta0 > 0 (beta0 = 0
could never move): pass learn_beta=False, or a small beta0 such as 1e-3.
The log-scales are clamped to [-40, 40] (a factor of about 2e17 either way), so that no
optimizer step, however violent, can round tau to 0 or to inf; at the clamp the gradient
stops pushing further out.

SymaxAttention learns eta the same way, eta = eta0 exp(log_eta_scale) (log_eta_scale = 0 at
init, clamped likewise; a learned eta needs eta0 > 0). SigmoidAttention's bias may have
either sign, so it learns an additive shift: bias = bias0 + bias_shift (bias_shift = 0 at
init), bias0 = -ln(Lk) at each call when no bias is given. Their parameters have
param_shape: () for one value, (H,) for one per head, or any shape broadcasting against
(B, H, 1, 1).

The gate (Qiu et al., "Gated Attention for Large Language Models"): every attention module
takes gate=False; gate=True (heads=H and head_dim=D then required, value_dim defaulting to D)
gives it a head-specific elementwise output gate computed from its query-side input,

    g = sigmoid(einsum('bhld,hde->bhle', q, gate_weight) + gate_bias[:, None, :])
    out = attention(q, k, v) * g             (the product in the kernels' epilogue)

gate_weight (H, D, Dv) starts at 0 and gate_bias (H, Dv) at +4 (GATE_BIAS), so g =
sigmoid(4) = 0.982 everywhere at construction: the module starts within 2% of the ungated
one and learns where to close. (The paper computes the gate from the hidden state X; q is X
times the head's query projection, so this is that gate through the projection. A model
that wants X itself computes g and passes it to the functional API's gate=.)

Storage: a learned (or fixed) log-scale or shift of param_shape () is stored as a 1-D tensor
of shape (1,), and viewed as 0-d where the module computes, so tau, beta, eta and the bias
keep param_shape (a 0-d tau for param_shape ()). FSDP2's fully_shard refuses 0-d
parameters; 1-D ones shard, all-reduce and checkpoint as any other (docs/distributed.md).
Checkpoints saved when these were 0-d load as they are: a 0-d saved value is reshaped to
(1,) on load. Other shapes are stored as given.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from .dispatch import traced
from .domains import BETA, ETA, TAU
from .functional import (
    Causal,
    cog_attention,
    elastic_attention,
    elastic_softmax,
    sigmoid_attention,
    softmax1_attention,
    stablemax_attention,
    symax_attention,
)
from .rows.native_rows import CPP, extension
from .rows.param_layout import as_rows, work_dtype
from .rows.spec import ELASTIC, ExpSpec
from .rows.tiers import TORCH, choose

LOG_SCALE_LIMIT = 40.0
GATE_BIAS = 4.0  # the gate's bias at construction: sigmoid(4) = 0.982, near the ungated module


def _init_gate(module: nn.Module, gate: bool, heads: int | None, head_dim: int | None,
               value_dim: int | None) -> None:
    """module.gate_weight (H, D, Dv) = 0 and module.gate_bias (H, Dv) = GATE_BIAS, learned,
    when gate (module doc); ValueError in one line when heads or head_dim is missing."""
    module.gated = bool(gate)
    if not gate:
        return
    if heads is None or head_dim is None:
        raise ValueError("gate=True needs heads= and head_dim= (the gate's weight is "
                         "(heads, head_dim, value_dim))")
    dims = {"heads": heads, "head_dim": head_dim,
            "value_dim": head_dim if value_dim is None else value_dim}
    for name, n in dims.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    module.gate_weight = nn.Parameter(torch.zeros(heads, head_dim, dims["value_dim"]))
    module.gate_bias = nn.Parameter(torch.full((heads, dims["value_dim"]), GATE_BIAS))


def _gate_values(module: nn.Module, q: torch.Tensor) -> torch.Tensor | None:
    """The gate g (B, H, Lq, Dv) in q's dtype from q (module doc), None without a gate."""
    if not module.gated:
        return None
    w, b = module.gate_weight, module.gate_bias
    if not (isinstance(q, torch.Tensor) and q.ndim == 4 and q.shape[1] == w.shape[0]
            and q.shape[3] == w.shape[1]):
        raise ValueError(f"the gate takes q of shape (batch, {w.shape[0]}, length, "
                         f"{w.shape[1]}), got {tuple(getattr(q, 'shape', ()))}")
    w, b = w.to(q.dtype), b.to(q.dtype)
    return torch.sigmoid(torch.einsum("bhld,hde->bhle", q, w) + b[:, None, :])


def _gate_repr(module: nn.Module) -> str:
    if not module.gated:
        return ""
    h, d, dv = module.gate_weight.shape
    return f", gate=True (heads={h}, head_dim={d}, value_dim={dv})"


def _stored_shape(param_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a parameter of param_shape is stored in: (1,) for (), else param_shape."""
    return tuple(param_shape) or (1,)


class _OneForScalar(nn.Module):
    """A module whose log-scales (or shift) of param_shape () are stored with shape (1,)
    and viewed as 0-d to compute (module doc). `_scalar_names` lists the tensors concerned;
    loading a state dict reshapes their 0-d saved values (checkpoints from before) to (1,)."""

    param_shape: tuple[int, ...] = ()
    _scalar_names: tuple[str, ...] = ()

    def _shaped(self, name: str) -> torch.Tensor:
        """The tensor `name` viewed as param_shape (itself unless param_shape is ())."""
        value = getattr(self, name)
        return value.reshape(()) if self.param_shape == () and value.ndim == 1 else value

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if self.param_shape == ():
            for name in self._scalar_names:
                saved = state_dict.get(prefix + name)
                if isinstance(saved, torch.Tensor) and saved.ndim == 0:
                    state_dict[prefix + name] = saved.reshape(1)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def _shown(self, value: torch.Tensor) -> str:
        """One value as a number, more as their shape."""
        if self.param_shape == ():
            return f"{value.detach().reshape(()).item():.4g}"
        return f"shape {self.param_shape}"

    def _sharded(self) -> str:
        """What repr shows for parameters sharded across processes (FSDP2's DTensors between
        steps): their shape, not a value, which would need every process to gather it."""
        return f"sharded, shape {self.param_shape}"


def _distributed_tensor(value: torch.Tensor) -> bool:
    """Whether value is a DTensor (FSDP2 holds sharded parameters as such between steps)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor
    return isinstance(value, DTensor)


def _scale(base: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    """base exp(clamp(log_scale)) in log_scale's dtype, base rounded to it once."""
    scale = torch.exp(log_scale.clamp(-LOG_SCALE_LIMIT, LOG_SCALE_LIMIT))
    return (base if log_scale.dtype == torch.float64 else base.to(log_scale.dtype)) * scale


def _one_native_node(module: ElasticSoftmax, x: torch.Tensor) -> bool:
    """Whether ElasticSoftmax's call runs as the native tier's one autograd node (tau and beta
    formed inside it): eager, recording autograd, along the last dimension of a CPU tensor
    that the native rows take (elasticbench.dispatch's choice, the switch included), with
    parameters that fit x. Anything else forms tau and beta first, then calls
    elastic_softmax."""
    s_tau = module.log_tau_scale
    if not (torch.is_grad_enabled() and x.ndim and module.dim % x.ndim == x.ndim - 1):
        return False
    if not (x.requires_grad or s_tau.requires_grad or module.log_beta_scale.requires_grad):
        return False
    return (not traced(x) and s_tau.device == x.device and choose(x, ELASTIC) is CPP
            and _fits(module.param_shape, tuple(x.shape)))


@functools.lru_cache(maxsize=256)
def _fits(param: tuple[int, ...], x: tuple[int, ...]) -> bool:
    """A parameter of this shape broadcasts against x with size 1 in x's last dimension.
    (Compared here: torch.broadcast_shapes imports torch's symbolic shapes, and with them
    sympy and mpmath, on its first call, a second of a model's first step.)"""
    if len(param) > len(x) or (param and param[-1] != 1):
        return False
    return all(p == n or 1 in (p, n) for p, n in zip(param, x[len(x) - len(param):], strict=True))


@functools.cache
def _native_scaled():
    """The native tier with elastic_scaled's create_graph path set."""
    ext = extension()
    ext.set_differentiable_scaled_backward(_differentiable_scaled_backward)
    return ext


def _differentiable_scaled_backward(x, y, g, tau0, log_tau, beta0, log_beta, limit,
                                    need_tau, need_beta) -> tuple:
    """elastic_scaled's backward where autograd builds the gradient's graph: the torch code,
    then the chain rule through the log-scales, all of it differentiable."""
    wd = work_dtype(x.dtype)
    tau, beta = _scale(tau0, log_tau), _scale(beta0, log_beta)
    t = as_rows(tau, x, x.ndim - 1, wd, keep_graph=True)
    b = as_rows(beta, x, x.ndim - 1, wd, keep_graph=True)
    dx, dt, db = TORCH.backward(x, y, g, ExpSpec(True, tau=t, offset=b), need_tau or need_beta)
    out = [dx, None, None]
    for i, (need, rows, laid, s) in enumerate(((need_tau, dt, t, log_tau),
                                               (need_beta, db, b, log_beta)), start=1):
        if need:
            total = rows.sum() if laid.ndim == 0 else rows.sum_to_size(laid.shape)
            out[i] = torch.autograd.grad(laid, s, total, create_graph=True)[0]
    return tuple(out)


class _LearnableTauBeta(_OneForScalar):
    """tau = tau0 exp(log_tau_scale), beta = beta0 exp(log_beta_scale) (see module doc)."""

    _scalar_names = ("log_tau_scale", "log_beta_scale")

    def __init__(self, tau: float, beta: float, learnable: bool, param_shape: tuple[int, ...],
                 learn_tau: bool | None = None, learn_beta: bool | None = None):
        super().__init__()
        checked = {"tau": TAU.check(tau), "beta": BETA.check(beta)}
        self.learn_tau = learnable if learn_tau is None else learn_tau
        self.learn_beta = learnable if learn_beta is None else learn_beta
        if self.learn_beta and checked["beta"] == 0:
            raise ValueError("a learned beta needs beta > 0 (it is learned on a log scale); "
                             "pass learn_beta=False to keep it at 0, or a small beta such as "
                             "1e-3")
        self.learnable = self.learn_tau and self.learn_beta
        self.param_shape = tuple(param_shape)
        # float64 whatever the module's dtype (see _apply): the user's values, exactly
        self.register_buffer("tau0", torch.full(param_shape, checked["tau"], dtype=torch.float64))
        self.register_buffer("beta0", torch.full(param_shape, checked["beta"],
                                                 dtype=torch.float64))
        for name, learned in (("log_tau_scale", self.learn_tau),
                              ("log_beta_scale", self.learn_beta)):
            scale = torch.zeros(_stored_shape(param_shape))
            if learned:
                setattr(self, name, nn.Parameter(scale))
            else:
                self.register_buffer(name, scale)

    def _apply(self, fn, recurse=True):
        """Moves and casts as nn.Module does, but tau0 and beta0 stay float64: a module made
        in float32 and then cast to float64 computes with the exact tau and beta it was given,
        not their float32 roundings."""
        exact = {name: getattr(self, name) for name in ("tau0", "beta0")}
        super()._apply(fn, recurse)
        for name, value in exact.items():
            moved = getattr(self, name)
            if moved.dtype != torch.float64:
                setattr(self, name, value.to(device=moved.device))
        return self

    def params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(tau, beta), each base exp(log_scale) in the log-scale's dtype (the module's). On
        CPU tensors, eagerly, as one native autograd node (elasticbench.native): the eight
        small nodes of the composite cost more than a small Elastic-Softmax itself
        (docs/dispatch.md section 5)."""
        s_tau, s_beta = self._shaped("log_tau_scale"), self._shaped("log_beta_scale")
        if s_tau.device.type == "cpu" and not traced(s_tau) and (ext := extension()) is not None:
            tau, beta = ext.scaled_params(self.tau0, s_tau, self.beta0, s_beta, LOG_SCALE_LIMIT)
            return tau, beta
        return _scale(self.tau0, s_tau), _scale(self.beta0, s_beta)

    @property
    def tau(self) -> torch.Tensor:
        return self.params()[0]

    @property
    def beta(self) -> torch.Tensor:
        return self.params()[1]

    def _params_repr(self) -> str:
        if _distributed_tensor(self.log_tau_scale) or _distributed_tensor(self.log_beta_scale):
            tau = beta = self._sharded()
        else:
            tau, beta = (self._shown(v) for v in self.params())
        return (f"tau={tau}, beta={beta}, learn_tau={self.learn_tau}, "
                f"learn_beta={self.learn_beta}")


class ElasticSoftmax(_LearnableTauBeta):
    """Elastic-Softmax along `dim` with learnable tau > 0 and beta >= 0 (see module doc).

    param_shape: () for one tau/beta, e.g. (H, 1, 1) for one per head of scores (B, H, L, L).
    learn_tau, learn_beta: which of the two to learn, when not both (learnable).
    """

    def __init__(self, dim: int = -1, tau: float = 1.0, beta: float = 1.0,
                 learnable: bool = True, param_shape: tuple[int, ...] = (), *,
                 learn_tau: bool | None = None, learn_beta: bool | None = None):
        super().__init__(tau, beta, learnable, param_shape, learn_tau, learn_beta)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _one_native_node(self, x):
            return _native_scaled().elastic_scaled(x, self.tau0, self._shaped("log_tau_scale"),
                                                   self.beta0, self._shaped("log_beta_scale"),
                                                   LOG_SCALE_LIMIT)
        tau, beta = self.params()
        return elastic_softmax(x, tau, beta, dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, {self._params_repr()}"


class ElasticAttention(_LearnableTauBeta):
    """Elastic attention of (q, k, v), each (B, H, L, D), with learnable tau and beta.

    Parameterised like ElasticSoftmax; param_shape () for one tau/beta, (H,) for one per
    head. scale defaults to 1/sqrt(D); causal as in scaled_dot_product_attention. gate=True
    (with heads and head_dim) adds the output gate of the module doc.
    """

    def __init__(self, tau: float = 1.0, beta: float = 1.0, learnable: bool = True,
                 param_shape: tuple[int, ...] = (), scale: float | None = None,
                 causal: Causal = False, *, learn_tau: bool | None = None,
                 learn_beta: bool | None = None, gate: bool = False,
                 heads: int | None = None, head_dim: int | None = None,
                 value_dim: int | None = None):
        super().__init__(tau, beta, learnable, param_shape, learn_tau, learn_beta)
        self.scale, self.causal = scale, causal
        _init_gate(self, gate, heads, head_dim, value_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor | None = None, is_causal: Causal = False) -> torch.Tensor:
        """As elastic_attention: attn_mask (bool, True takes part, or float, added to the
        scores) broadcastable to (B, H, Lq, Lk); is_causal adds the causal mask."""
        tau, beta = self.params()
        return elastic_attention(q, k, v, tau=tau, beta=beta, scale=self.scale,
                                 causal=self.causal, is_causal=is_causal,
                                 attn_mask=attn_mask, gate=_gate_values(self, q))

    def extra_repr(self) -> str:
        return (f"{self._params_repr()}, scale={self.scale}, causal={self.causal}"
                f"{_gate_repr(self)}")


class _FamilyAttention(nn.Module):
    """scale, causal and the gate (gate, heads, head_dim, value_dim) as ElasticAttention
    takes them; forward(q, k, v, attn_mask, is_causal) as the functional form."""

    def __init__(self, scale: float | None = None, causal: Causal = False, *,
                 gate: bool = False, heads: int | None = None, head_dim: int | None = None,
                 value_dim: int | None = None):
        super().__init__()
        self.scale, self.causal = scale, causal
        _init_gate(self, gate, heads, head_dim, value_dim)

    def _kwargs(self, q: torch.Tensor, attn_mask: torch.Tensor | None,
                is_causal: bool) -> dict:
        return {"scale": self.scale, "causal": self.causal, "is_causal": is_causal,
                "attn_mask": attn_mask, "gate": _gate_values(self, q)}

    def extra_repr(self) -> str:
        return f"scale={self.scale}, causal={self.causal}{_gate_repr(self)}"


class Softmax1Attention(_FamilyAttention):
    """softmax1 attention of (q, k, v), each (B, H, L, D): no parameter
    (elasticbench.functional.softmax1_attention)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor | None = None, is_causal: Causal = False) -> torch.Tensor:
        return softmax1_attention(q, k, v, **self._kwargs(q, attn_mask, is_causal))


class StablemaxAttention(_FamilyAttention):
    """stablemax attention of (q, k, v), each (B, H, L, D): no parameter
    (elasticbench.functional.stablemax_attention)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor | None = None, is_causal: Causal = False) -> torch.Tensor:
        return stablemax_attention(q, k, v, **self._kwargs(q, attn_mask, is_causal))


class CogAttention(_FamilyAttention):
    """Cog attention of (q, k, v), each (B, H, L, D): signed weights, no parameter
    (elasticbench.functional.cog_attention)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor | None = None, is_causal: Causal = False) -> torch.Tensor:
        return cog_attention(q, k, v, **self._kwargs(q, attn_mask, is_causal))


class SymaxAttention(_FamilyAttention, _OneForScalar):
    """symax attention of (q, k, v) with eta = eta0 exp(log_eta_scale), learned on a log scale
    as ElasticAttention's tau (see module doc); param_shape () or (H,) or broadcasting
    against (B, H, 1, 1)."""

    _scalar_names = ("log_eta_scale",)

    def __init__(self, eta: float = 1.0, learnable: bool = True,
                 param_shape: tuple[int, ...] = (), scale: float | None = None,
                 causal: Causal = False, *, gate: bool = False, heads: int | None = None,
                 head_dim: int | None = None, value_dim: int | None = None):
        super().__init__(scale, causal, gate=gate, heads=heads, head_dim=head_dim,
                         value_dim=value_dim)
        checked = ETA.check(eta)
        if learnable and checked == 0:
            raise ValueError("a learned eta needs eta > 0 (it is learned on a log scale); pass "
                             "learnable=False to keep it at 0, or a small eta such as 1e-3")
        self.learnable = learnable
        self.param_shape = tuple(param_shape)
        self.register_buffer("eta0", torch.full(param_shape, checked, dtype=torch.float64))
        scale0 = torch.zeros(_stored_shape(param_shape))
        if learnable:
            self.log_eta_scale = nn.Parameter(scale0)
        else:
            self.register_buffer("log_eta_scale", scale0)

    def _apply(self, fn, recurse=True):
        """As nn.Module's, but eta0 stays float64 (ElasticAttention's tau0 and beta0 do)."""
        exact = self.eta0
        super()._apply(fn, recurse)
        if self.eta0.dtype != torch.float64:
            self.eta0 = exact.to(device=self.eta0.device)
        return self

    @property
    def eta(self) -> torch.Tensor:
        """eta0 exp(log_eta_scale) in the log-scale's dtype (the module's). On CPU tensors,
        eagerly, as one native autograd node with the same ops and gradient chain as the
        composite's four (elasticbench.native)."""
        s = self._shaped("log_eta_scale")
        if s.device.type == "cpu" and not traced(s) and (ext := extension()) is not None:
            return ext.scaled_param(self.eta0, s, LOG_SCALE_LIMIT)
        return _scale(self.eta0, s)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor | None = None, is_causal: Causal = False) -> torch.Tensor:
        return symax_attention(q, k, v, eta=self.eta, **self._kwargs(q, attn_mask, is_causal))

    def extra_repr(self) -> str:
        shown = (self._sharded() if _distributed_tensor(self.log_eta_scale)
                 else self._shown(self.eta))
        return f"eta={shown}, learnable={self.learnable}, {super().extra_repr()}"


class SigmoidAttention(_FamilyAttention, _OneForScalar):
    """sigmoid attention of (q, k, v) with bias = bias0 + bias_shift (see module doc):
    bias0 the given bias, or -ln(Lk) at each call when bias is None; bias_shift learned
    when learnable."""

    _scalar_names = ("bias_shift",)

    def __init__(self, bias: float | None = None, learnable: bool = True,
                 param_shape: tuple[int, ...] = (), scale: float | None = None,
                 causal: Causal = False, *, gate: bool = False, heads: int | None = None,
                 head_dim: int | None = None, value_dim: int | None = None):
        super().__init__(scale, causal, gate=gate, heads=heads, head_dim=head_dim,
                         value_dim=value_dim)
        if bias is not None:
            try:
                bias = float(bias)
            except (TypeError, ValueError):
                raise ValueError(f"bias must be a number or None, got {bias!r}") from None
            if not math.isfinite(bias):
                raise ValueError(f"bias must be finite, got {bias!r}")
        self.bias0 = bias
        self.learnable = learnable
        self.param_shape = tuple(param_shape)
        shift = torch.zeros(_stored_shape(param_shape))
        if learnable:
            self.bias_shift = nn.Parameter(shift)
        else:
            self.register_buffer("bias_shift", shift)

    def bias(self, length_k: int) -> torch.Tensor:
        """The bias for length_k keys, in the shift's dtype, differentiable in the shift."""
        base = self.bias0 if self.bias0 is not None else (
            -math.log(length_k) if length_k > 0 else 0.0)
        return self._shaped("bias_shift") + base

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor | None = None, is_causal: Causal = False) -> torch.Tensor:
        bias = self.bias(k.shape[2] if isinstance(k, torch.Tensor) and k.ndim == 4 else 1)
        return sigmoid_attention(q, k, v, bias=bias, **self._kwargs(q, attn_mask, is_causal))

    def extra_repr(self) -> str:
        base = "-ln(Lk)" if self.bias0 is None else f"{self.bias0:.4g}"
        return f"bias={base} + shift, learnable={self.learnable}, {super().extra_repr()}"


__all__ = ["CogAttention", "ElasticAttention", "ElasticSoftmax", "SigmoidAttention",
           "Softmax1Attention", "StablemaxAttention", "SymaxAttention"]
