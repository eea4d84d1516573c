"""torch modules: ElasticSoftmax and ElasticAttention with learnable temperature and offset.

Parametrization (documented contract): with tau0, beta0 the values given at construction,

    tau  = tau0  * exp(log_tau_scale)       log_tau_scale  = 0 at init
    beta = beta0 * exp(log_beta_scale)      log_beta_scale = 0 at init

exp(0) is exactly 1, so the module computes with exactly tau0 and beta0 at init; tau stays
> 0 and beta >= 0 whatever the optimizer does, and both learn on a log scale, which suits
scale parameters spanning orders of magnitude. A learnable beta therefore needs beta0 > 0
(beta0 = 0 could never move); use learnable=False, or a small beta0 such as 1e-3.
The log-scales are clamped to [-40, 40] (a factor of about 2e17 either way), so that no
optimizer step, however violent, can round tau to 0 or to inf; at the clamp the gradient
stops pushing further out.
"""

from __future__ import annotations

import torch
from torch import nn

from .functional import elastic_attention, elastic_softmax
from .functions import get_function

LOG_SCALE_LIMIT = 40.0


class _LearnableTauBeta(nn.Module):
    """tau = tau0 exp(log_tau_scale), beta = beta0 exp(log_beta_scale) (see module doc)."""

    def __init__(self, tau: float, beta: float, learnable: bool, param_shape: tuple[int, ...]):
        super().__init__()
        checked = get_function("elastic").validate_params({"tau": tau, "beta": beta})
        if learnable and checked["beta"] == 0:
            raise ValueError("a learnable beta needs beta > 0 (it is learned on a log scale); "
                             "pass learnable=False or a small beta such as 1e-3")
        self.learnable = learnable
        self.register_buffer("tau0", torch.full(param_shape, checked["tau"]))
        self.register_buffer("beta0", torch.full(param_shape, checked["beta"]))
        scale = torch.zeros(param_shape)
        if learnable:
            self.log_tau_scale = nn.Parameter(scale.clone())
            self.log_beta_scale = nn.Parameter(scale.clone())
        else:
            self.register_buffer("log_tau_scale", scale.clone())
            self.register_buffer("log_beta_scale", scale.clone())

    @property
    def tau(self) -> torch.Tensor:
        return self.tau0 * torch.exp(self.log_tau_scale.clamp(-LOG_SCALE_LIMIT, LOG_SCALE_LIMIT))

    @property
    def beta(self) -> torch.Tensor:
        return self.beta0 * torch.exp(
            self.log_beta_scale.clamp(-LOG_SCALE_LIMIT, LOG_SCALE_LIMIT))

    def _params_repr(self) -> str:
        t, b = self.tau.detach(), self.beta.detach()
        show = (lambda v: f"{v.item():.4g}") if t.ndim == 0 else (lambda v: f"shape {tuple(v.shape)}")
        return f"tau={show(t)}, beta={show(b)}, learnable={self.learnable}"


class ElasticSoftmax(_LearnableTauBeta):
    """Elastic-Softmax along `dim` with learnable tau > 0 and beta >= 0 (see module doc).

    param_shape: () for one tau/beta, e.g. (H, 1, 1) for one per head of scores (B, H, L, L).
    """

    def __init__(self, dim: int = -1, tau: float = 1.0, beta: float = 1.0,
                 learnable: bool = True, param_shape: tuple[int, ...] = ()):
        super().__init__(tau, beta, learnable, param_shape)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return elastic_softmax(x, self.tau, self.beta, dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, {self._params_repr()}"


class ElasticAttention(_LearnableTauBeta):
    """Elastic attention of (q, k, v), each (B, H, L, D), with learnable tau and beta.

    Parameterised like ElasticSoftmax; param_shape () for one tau/beta, (H,) for one per
    head. scale defaults to 1/sqrt(D); causal as in scaled_dot_product_attention.
    """

    def __init__(self, tau: float = 1.0, beta: float = 1.0, learnable: bool = True,
                 param_shape: tuple[int, ...] = (), scale: float | None = None,
                 causal: bool = False):
        super().__init__(tau, beta, learnable, param_shape)
        self.scale, self.causal = scale, causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return elastic_attention(q, k, v, tau=self.tau, beta=self.beta, scale=self.scale,
                                 causal=self.causal)

    def extra_repr(self) -> str:
        return f"{self._params_repr()}, scale={self.scale}, causal={self.causal}"


__all__ = ["ElasticAttention", "ElasticSoftmax"]
