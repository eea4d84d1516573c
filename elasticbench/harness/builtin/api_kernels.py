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
(docs/benchmarking.md section 7).

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

import functools
import weakref
from collections.abc import Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from elasticbench.dispatch import preference
from elasticbench.functional import elastic_attention, elastic_softmax
from elasticbench.harness.backends import get_backend
from elasticbench.harness.kernel_spec import register_kernel
from elasticbench.nn import ElasticSoftmax

# The raw kernel each implementation of elasticbench.dispatch runs, per (function, mode).
RAW = {
    ("elastic", "fwd"): {"cpp": "cpp_elastic", "triton": "triton_elastic",
                         "torch": "torch_elastic"},
    ("elastic", "bwd"): {"cpp": "cpp_elastic_bwd", "triton": "triton_elastic",
                         "torch": "torch_elastic_bwd"},
    ("elastic_attention", "fwd"): {"cpp": "cpp_attention", "triton": "triton_attention",
                                   "torch": "torch_attention_flash"},
}
RAW["elastic_attention", "bwd"] = RAW["elastic_attention", "fwd"]


def raw_kernel(function: str, mode: str) -> str | None:
    """The raw kernel an API call of `function` runs on the torch backend's device: the
    first of the device's implementations whose backend is available here."""
    names = RAW[function, mode]
    device = torch.device(get_backend("torch").device())
    for impl in preference(device):
        if impl in names and (impl == "torch" or get_backend(impl).available()):
            return names[impl]
    return None


def _wraps(function: str, mode: str) -> Callable[[Callable], Callable]:
    """Declare (fn.wraps, read by elasticbench.harness.bench.models.wrapped_kernel) the raw kernel
    the kernel's call runs, resolved when asked."""
    def deco(fn: Callable) -> Callable:
        fn.wraps = functools.partial(raw_kernel, function, mode)  # type: ignore[attr-defined]
        return fn
    return deco


def _work(dtype: torch.dtype) -> torch.dtype:
    """The working dtype: fp64 for fp64 inputs, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@functools.lru_cache(maxsize=64)
def _module(device: str, dtype: torch.dtype, tau: float, beta: float) -> ElasticSoftmax:
    """An ElasticSoftmax computing with exactly tau and beta (in dtype) on device."""
    module = ElasticSoftmax(tau=tau, beta=beta, learn_beta=beta > 0).to(device=device,
                                                                      dtype=dtype)
    with torch.no_grad():  # the case's values in the working dtype, not fp32's rounding
        module.tau0.fill_(tau)
        module.beta0.fill_(beta)
    return module


def _module_for(x: torch.Tensor, tau: float, beta: float) -> ElasticSoftmax:
    return _module(str(x.device), _work(x.dtype), float(tau), float(beta))


@register_kernel(function="elastic", backend="torch", name="api_elastic", compiles=False)
@_wraps("elastic", "fwd")
def api_elastic(x: torch.Tensor, *, tau: float, beta: float) -> torch.Tensor:
    """elasticbench.nn.ElasticSoftmax as a training forward calls it: learnable tau, beta."""
    with torch.enable_grad():
        return _module_for(x, tau, beta)(x)


class _Graph:
    """A forward's output and the tensors its backward is taken to: x's leaf, then tau and
    beta as the module computed them, then the module's learned log-scales."""

    def __init__(self, x: torch.Tensor, tau: float, beta: float):
        module = _module_for(x, tau, beta)
        self.x = x.detach().requires_grad_()
        with torch.enable_grad():
            t = module.tau
            b = module.beta if module.learn_beta else module.beta.detach().requires_grad_()
            self.y = elastic_softmax(self.x, t, b, dim=module.dim)  # module.forward's call
        self.inputs = (self.x, t, b, *module.parameters())
        self.saved: weakref.ref | None = None  # the y the graph's output holds

    def hold(self, y: torch.Tensor) -> None:
        """Make the output the backward reads y's values (see the module docstring)."""
        if self.saved is None or self.saved() is not y:
            self.y.data.copy_(y)
            self.saved = weakref.ref(y)


_graphs: WeakIdKeyDictionary = WeakIdKeyDictionary()  # x -> {(tau, beta): _Graph}


@register_kernel(function="elastic", backend="torch", name="api_elastic", mode="bwd",
                 compiles=False)
@_wraps("elastic", "bwd")
def api_elastic_bwd(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, *, tau: float,
                    beta: float):
    """ElasticSoftmax's backward through autograd: dx, dtau, dbeta (forward once per x)."""
    per_x = _graphs.setdefault(x, {})
    key = (float(tau), float(beta))
    graph = per_x.get(key) or per_x.setdefault(key, _Graph(x, *key))
    graph.hold(y)
    dx, dtau, dbeta, *_ = torch.autograd.grad(graph.y, graph.inputs, g, retain_graph=True)
    return dx, dtau, dbeta


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
@_wraps("elastic_attention", "fwd")
def api_attention(q, k, v, *, tau, beta, scale, causal, attn_mask=None):
    """elasticbench.functional.elastic_attention with learnable per-(batch, head) tau, beta."""
    with torch.enable_grad():
        return elastic_attention(q, k, v, tau=_per_head(_learnable(tau)),
                                 beta=_per_head(_learnable(beta)), scale=scale,
                                 causal=causal, attn_mask=attn_mask)


@register_kernel(function="elastic_attention", backend="torch", mode="bwd",
                 name="api_attention", compiles=False)
@_wraps("elastic_attention", "bwd")
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
