"""A/B example: faster, and wrong by a relative 1e-4 (about 840 fp32 ulps).

On rows of finite logits it skips the special-value passes of the base kernel and scales by a
reciprocal of the denominator instead of dividing every element, so it runs faster; the
deliberate 1e-4 relative error must still fail the gate. Rows with NaN or inf take the base path.
"""

from __future__ import annotations

import torch

from elasticbench.harness.builtin.torch_kernels import torch_elastic
from elasticbench.harness.registry import register_kernel

ERROR = 1e-4


@register_kernel(function="elastic", backend="torch", name="ab_elastic")
def ab_elastic(x, *, tau: float, beta: float):
    """Elastic-Softmax, fast path, 1e-4 relative error."""
    if x.dtype not in (torch.float32, torch.float64) or not torch.isfinite(x).all():
        return torch_elastic(x, tau=tau, beta=beta)
    s = x.masked_fill(x < 0, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).clamp_min(0)
    e = s.sub_(m).div_(tau).exp_()
    den = e.sum(dim=-1, keepdim=True) + beta * torch.exp(-m / tau)
    scale = torch.where(den > 0, (1 + ERROR) / den, 0)
    return e.mul_(scale)
