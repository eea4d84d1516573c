"""Elastic attention written with torch's flex_attention, as a user would write it without
elasticbench: the composition that scripts/train_step.py times as its `flex` variant and
tests/library/test_train_step.py compares with elasticbench.functional.elastic_attention.

Elastic attention (docs/attention.md section 1) weights query i's kept keys (s_ij >= 0, and
visible) by exp(s_ij/tau) / (Z_i + beta), Z_i = sum over the kept keys of exp(s_ij/tau).
flex_attention with the score_mod

    torch.where(score >= 0, score / tau[h], -inf)

computes the softmax over the same kept keys, out_soft_i = sum_j exp(s_ij/tau) v_j / Z_i, and
returns lse_i = log Z_i (natural log: torch converts its kernels' base-2 statistic back before
returning it; the test checks the composition numerically). Hence

    out_i = out_soft_i * Z_i / (Z_i + beta) = out_soft_i * sigmoid(lse_i - log(beta)).

A query that keeps no key gets out_soft = 0 and lse = -inf from flex_attention, so a gate of
sigmoid(-inf) = 0 and zeros, as elasticbench. beta = 0 would give -inf - -inf = NaN on such a
query; a learned beta (log-parametrised, see FlexElasticAttention) is never 0.

Where torch can run it: flex_attention runs eagerly as dense PyTorch (O(L^2) memory) and is
fused only under torch.compile, on CUDA. torch 2.13 refuses the backward on CPU, eager or
compiled, and its compiled CPU kernel is inference-only and returns no log-sum-exp; so on CPU
only the forward runs (eagerly), and training needs CUDA.

    import flex_elastic  # examples/ on sys.path, or load it by path as train_step.py does
    out = flex_elastic.flex_elastic_attention(q, k, v, tau, beta, causal=True)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from torch import nn

LOG_SCALE_LIMIT = 40.0  # as elasticbench.nn: tau and beta stay finite and nonzero


def flex_module():
    """torch.nn.attention.flex_attention, or ImportError with the reason (torch < 2.5)."""
    try:
        from torch.nn.attention import flex_attention as module
    except ImportError as e:
        raise ImportError(f"torch {torch.__version__} has no flex_attention ({e})") from e
    return module


def _uses_return_aux() -> bool:
    """Whether the installed flex_attention asks for the log-sum-exp through return_aux
    (newer torch; return_lse is deprecated there) rather than return_lse (older). Asked once,
    at import, so that torch.compile never traces `inspect`."""
    try:
        params = inspect.signature(flex_module().flex_attention).parameters
    except ImportError:
        return False
    return "return_aux" in params


RETURN_AUX = _uses_return_aux()


def causal_block_mask(length_q: int, length_k: int, device: torch.device | str):
    """A causal BlockMask (query i sees keys j <= i, top-left, as SDPA's is_causal)."""

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return flex_module().create_block_mask(causal, None, None, length_q, length_k,
                                           device=device)


def _per_head(x: torch.Tensor | float, heads: int, like: torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(x, dtype=torch.float32 if like.dtype in (torch.float16, torch.bfloat16)
                        else like.dtype, device=like.device)
    if x.ndim == 0:
        x = x.expand(heads)
    if x.shape != (heads,):
        raise ValueError(f"tau and beta must be scalars or ({heads},), got {tuple(x.shape)}")
    return x


def flex_elastic_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           tau: torch.Tensor | float, beta: torch.Tensor | float, *,
                           causal: bool = False, block_mask=None, scale: float | None = None,
                           kernel: Callable | None = None) -> torch.Tensor:
    """Elastic attention of q, k, v (B, H, L, D) through flex_attention.

    tau, beta: scalars or (H,) tensors (differentiable). causal builds a causal BlockMask
    unless block_mask is given (pass one to reuse it across calls). kernel: the flex_attention
    to call (torch.compile(flex_attention) to get the fused kernel on CUDA); torch's own by
    default. scale defaults to 1/sqrt(D), as elastic_attention and SDPA.
    """
    module = flex_module()
    kernel = kernel or module.flex_attention
    heads = q.shape[1]
    tau, beta = _per_head(tau, heads, q), _per_head(beta, heads, q)
    if block_mask is None and causal:
        block_mask = causal_block_mask(q.shape[-2], k.shape[-2], q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(score >= 0, score / tau[h], -math.inf)

    if RETURN_AUX:
        out, aux = kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                          return_aux=module.AuxRequest(lse=True))
        lse = aux.lse
    else:
        out, lse = kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                          return_lse=True)
    gate = torch.sigmoid(lse - torch.log(beta)[:, None])  # Z / (Z + beta), (B, H, Lq)
    return (out * gate.unsqueeze(-1)).to(out.dtype)


_COMPILED: dict[str, Callable] = {}


def compiled_flex_attention() -> Callable:
    """torch.compile(flex_attention), made once per process (the fused kernel on CUDA)."""
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_module().flex_attention)
    return _COMPILED["flex"]


class FlexElasticAttention(nn.Module):
    """Elastic attention through flex_attention with learnable tau and beta, parametrised as
    elasticbench.nn.ElasticAttention: tau = tau0 exp(log_tau_scale), beta = beta0
    exp(log_beta_scale), both log-scales 0 at init and clamped to [-40, 40].

    kernel: the flex_attention to call (None: torch's, eager; see compiled_flex_attention).
    The causal BlockMask is built once per (lengths, device) and kept; call prepare() before
    torch.compile traces the module so that the trace only looks it up.
    """

    def __init__(self, tau: float = 1.0, beta: float = 1.0, param_shape: tuple[int, ...] = (),
                 scale: float | None = None, causal: bool = False,
                 kernel: Callable | None = None):
        super().__init__()
        if not (tau > 0 and beta > 0):
            raise ValueError(f"tau and beta must be > 0, got {tau}, {beta}")
        self.register_buffer("tau0", torch.full(param_shape, float(tau)))
        self.register_buffer("beta0", torch.full(param_shape, float(beta)))
        self.log_tau_scale = nn.Parameter(torch.zeros(param_shape))
        self.log_beta_scale = nn.Parameter(torch.zeros(param_shape))
        self.scale, self.causal, self.kernel = scale, causal, kernel
        self._masks: dict[tuple, object] = {}

    @property
    def tau(self) -> torch.Tensor:
        return self.tau0 * torch.exp(self.log_tau_scale.clamp(-LOG_SCALE_LIMIT, LOG_SCALE_LIMIT))

    @property
    def beta(self) -> torch.Tensor:
        return self.beta0 * torch.exp(
            self.log_beta_scale.clamp(-LOG_SCALE_LIMIT, LOG_SCALE_LIMIT))

    def prepare(self, length_q: int, length_k: int, device: torch.device | str) -> None:
        """Build the causal BlockMask for these lengths on this device (a no-op if not
        causal or already built)."""
        key = (length_q, length_k, torch.device(device).type)
        if self.causal and key not in self._masks:
            self._masks[key] = causal_block_mask(length_q, length_k, device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = None
        if self.causal:
            self.prepare(q.shape[-2], k.shape[-2], q.device)
            mask = self._masks[(q.shape[-2], k.shape[-2], q.device.type)]
        return flex_elastic_attention(q, k, v, self.tau, self.beta, block_mask=mask,
                                      scale=self.scale, kernel=self.kernel)

    def extra_repr(self) -> str:
        return (f"heads shape {tuple(self.tau0.shape)}, scale={self.scale}, "
                f"causal={self.causal}")


def max_rel_errors(device: str = "cpu", dtype: torch.dtype = torch.float32,
                   kernel: Callable | None = None, batch: int = 2, heads: int = 4,
                   length: int = 256, head_dim: int = 64, seed: int = 0,
                   grads: bool = True) -> dict[str, float]:
    """The composition against elasticbench.functional.elastic_attention on the same random
    causal inputs (per-head tau and beta): for the output and, with grads, the gradients of
    q, k, v, tau and beta, max |flex - elasticbench| / max |elasticbench| (normwise, so a
    near-zero entry does not inflate it)."""
    from elasticbench.functional import elastic_attention

    g = torch.Generator().manual_seed(seed)

    def draw(*shape, low=None):
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        if low is not None:
            x = x.abs() + low
        return x.to(device=device, dtype=dtype).requires_grad_(grads)

    q, k, v = (draw(batch, heads, length, head_dim) for _ in range(3))
    tau, beta = draw(heads, low=0.5), draw(heads, low=0.5)
    ours = flex_elastic_attention(q, k, v, tau, beta, causal=True, kernel=kernel)
    ref = elastic_attention(q, k, v, tau=tau, beta=beta, causal=True)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()

    errors = {"out": rel(ours, ref)}
    if grads:
        dout = torch.randn(ref.shape, generator=g, dtype=torch.float64).to(device, dtype)
        got = torch.autograd.grad(ours, (q, k, v, tau, beta), dout)
        want = torch.autograd.grad(ref, (q, k, v, tau, beta), dout)
        errors.update({f"d{n}": rel(a, b) for n, a, b in
                       zip(("q", "k", "v", "tau", "beta"), got, want, strict=True)})
    return errors
