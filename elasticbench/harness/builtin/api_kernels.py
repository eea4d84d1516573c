"""The library as users call it (backend `torch`): `elasticbench.nn.ElasticSoftmax` and
`elasticbench.functional.elastic_attention`, timed as kernels beside the raw kernels they run.

A raw kernel (cpp_elastic, triton_elastic, ...) takes Python floats and calls its code
directly. A user's call goes through the API: tau and beta are learnable tensors, the module
computes them on each call (tau = tau0 exp(log_tau_scale)), elasticbench.dispatch picks an
implementation for the device, the parameters are laid out for it, and autograd records the
graph (docs/dispatch.md). The `api_` kernels time that whole call. Each
declares the raw kernel its call runs on the torch backend's device (`wraps`, resolved when
a run executes): the first available of elasticbench.dispatch's preference for the device
(CPU: the native C++ kernels where they build, else the torch code; CUDA: Triton, else the
torch code; $ELASTICBENCH_IMPLEMENTATION forces one). Each run record carries that name, and
the run table shows the record's median over that kernel's, in the same run, as `overhead`
(docs/benchmarking.md section 7). `api_elastic` is registered from the elastic table of
elasticbench/harness/builtin/row_ops.py (its call, `row_ops.Api`, and `RAW`, the raw kernel
each implementation runs, live there); `api_attention` here.

What each one times:

- `api_elastic` forward: `ElasticSoftmax(tau=tau, beta=beta)(x)` with grad enabled (a
  training step's forward): x does not require grad, the module's log-scales do, so tau and
  beta are computed and the call records its autograd node every time. The module is
  built once per (device, working dtype, tau, beta) and not timed: on x's device, in the
  working dtype (fp32 for fp32/fp16/bf16 inputs, fp64 for fp64), tau0 and beta0 set to the
  case's values in that dtype. beta = 0 cannot be learned on a log scale (the module refuses
  it), so there beta is fixed (learn_beta=False), as a user's module would hold it.
- `api_elastic` backward (fn(x, y, g, *, tau, beta) -> (dx, dtau, dbeta)): what a user pays
  for the backward, `torch.autograd.grad` of the module's output from upstream g, down to x
  and the module's log-scales. autograd differentiates a graph of its own forward, so the
  first call on an input x runs the forward (the module's, with x requiring grad) and keeps
  its graph while x lives; that call is a timing's warm-up, and every call after it times
  the backward alone (retain_graph). The row backward contract judges a backward on the
  saved output it is given, apart from any forward (docs/gradients.md): so the given y is
  written into the output the graph saved (in place, through `.data`, outside autograd's
  version check; once per (x, y) pair, not timed) and the backward reads it, as it reads
  its own forward's output in a model. dtau and dbeta are the gradients of the tau and beta
  tensors the module computed (autograd returns them exactly as the op's backward gives
  them, not converted back from the log-scales' dtau * tau); with beta = 0, beta is a leaf
  tensor that requires grad, as a functional user's would be.
- `api_attention` (function elastic_attention, forward and backward):
  `elastic_attention(q, k, v, tau=tau, beta=beta, scale=scale, causal=causal,
  attn_mask=attn_mask)` with tau and beta the contract's (batch, heads) values held as
  learnable leaf tensors (one per input tensor, kept while it lives) and passed as
  (batch, heads, 1, 1) views: the functional API, since ElasticAttention holds one value
  per head and the contract's are per (batch, head). The backward follows the attention
  contract: the first call runs the forward with q, k, v, tau and beta requiring grad
  (untimed), step(dout) is autograd's backward to all five. Masks come as SDPA takes them
  (attn_mask): a bool key-padding mask (what `run` gives) runs the tiled kernels, any other
  mask the composite, whose time the declared raw kernel does not describe.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from elasticbench.functional import elastic_attention
from elasticbench.harness.builtin.row_ops import register_rows, wraps_raw
from elasticbench.harness.kernel_spec import register_kernel

register_rows("api", globals())

_held: WeakIdKeyDictionary = WeakIdKeyDictionary()  # a contract's tau or beta -> its leaf


def _learnable(p: torch.Tensor) -> torch.Tensor:
    """The (batch, heads) parameter as a leaf that requires grad, held while p lives."""
    leaf = _held.get(p)
    if leaf is None:
        leaf = _held.setdefault(p, p.detach().requires_grad_())
    return leaf


def _per_head(p: torch.Tensor) -> torch.Tensor:
    return p[:, :, None, None]


@register_kernel(function="elastic_attention", backend="torch", name="api_attention",
                 compiles=False)
@wraps_raw("elastic_attention", "fwd")
def api_attention(q, k, v, *, tau, beta, scale, causal, attn_mask=None):
    """elasticbench.functional.elastic_attention with learnable per-(batch, head) tau, beta."""
    with torch.enable_grad():
        return elastic_attention(q, k, v, tau=_per_head(_learnable(tau)),
                                 beta=_per_head(_learnable(beta)), scale=scale,
                                 causal=causal, attn_mask=attn_mask)


@register_kernel(function="elastic_attention", backend="torch", mode="bwd",
                 name="api_attention", compiles=False)
@wraps_raw("elastic_attention", "bwd")
def api_attention_bwd(q, k, v, *, tau, beta, scale, causal, attn_mask=None):
    """elastic_attention's forward with autograd (untimed), then step(dout): its backward."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v, tau, beta)]
    with torch.enable_grad():
        out = elastic_attention(*leaves[:3], tau=_per_head(leaves[3]),
                                beta=_per_head(leaves[4]), scale=scale, causal=causal,
                                attn_mask=attn_mask)

    def step(dout: torch.Tensor):
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)
    return step

