"""The library's row ops, registered from one table per row function.

The harness judges the library's row kernels as it judges any kernel: each is registered with
`register_kernel` under its name, function, backend and declarations. `ROWS` holds one `Row`
per row function (elastic, softmax, softmax1, stablemax, symax; docs/definitions.md): what
the function computes, as the library's calls take it (an `ExpSpec` of elasticbench.rows.spec
for the exp family, a `WeightSpec` for the weight family), and one `Kernel` per registered
kernel: the library it comes from, its name and mode, the library call it runs, its pass
model (elasticbench.harness.passes), its formats and its docstring, whose first line `list`
shows. The libraries (`LIBRARIES`):

    cpp     the native pass structures (kernels/cpp, docs/native.md)         backend cpp
    torch   the torch tier (elasticbench.rows.exp_normalize: the code a model  backend torch
            runs where no faster tier does), and torch code for the weight family
    triton  the Triton row kernels (elasticbench.kernels.triton, docs/triton.md) backend triton
    api     the public API as users call it (elasticbench.nn, autograd;   backend torch
            elasticbench/harness/builtin/api_kernels.py says what each times)

Each kind of library call has one adapter, written once (`NativeExp`, `NativeWeight`,
`TorchExp`, `TorchWeight`, `Triton`, `Api`): it binds a row's computation to the call when the
kernel registers, so nothing of a library absent here is imported. Each library's module
(cpp_kernels.py, torch_kernels.py, triton_kernels.py, api_kernels.py; the registry imports it
where its backend runs) calls `register_rows(<library>, globals())`, which registers the
library's kernels, every forward in table order and then every backward (the registry's
order, which `elasticbench list` shows). This module registers nothing itself.

A kernel function takes the row contract's arguments, fn(x, **params) forward and fn(x, y,
g, **params) backward (docs/guide/writing-a-kernel.md), the function's parameters by keyword;
it becomes an attribute of the registering module, named as the kernel (a backward's name
gains `_bwd` where it lacks it), so that it pickles by reference and the module that
registered it can be found from it (verify's lanes, `gate ab --rev`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from elasticbench import native
from elasticbench.dispatch import preference
from elasticbench.functional import elastic_softmax
from elasticbench.harness.backends import get_backend
from elasticbench.harness.functions import get_function
from elasticbench.harness.kernel_spec import MODES, register_kernel
from elasticbench.harness.passes import PassModel
from elasticbench.nn import ElasticSoftmax
from elasticbench.rows import spec as exp
from elasticbench.rows.exp_normalize import exp_normalize_backward, exp_normalize_forward
from elasticbench.rows.spec import ExpSpec

Tensor = torch.Tensor
Body = Callable[..., Any]  # body(x, *values) forward, body(x, y, g, *values) backward


@dataclass(frozen=True)
class WeightSpec:
    """A row of the weight family: w / (constant + sum w), w = |x| for symax (its constant
    is eta), else st(x) = x + 1 for x >= 0 and 1 / (1 - x) below (stablemax, constant 0)."""

    symax: bool


Computes = ExpSpec | WeightSpec


class Call:
    """One kind of library call. bind(computes, mode) gives the body of a kernel of that
    mode: body(x, *values) forward, body(x, y, g, *values) backward, values being the row
    function's parameters in its order (tau, beta for elastic; eta for symax; none else)."""

    def bind(self, computes: Any, mode: str) -> Body:
        raise NotImplementedError

    def formats(self) -> tuple[str, ...] | None:
        """The formats every kernel of this call takes (None: all), unless one declares its
        own."""
        return None

    def declare(self, fn: Callable, function: str, mode: str) -> None:
        """Attach what the call declares about a kernel function (Api: what it wraps)."""


# --- the native kernels (elasticbench.native; docs/native.md) --------------------------


@dataclass(frozen=True)
class NativeExp(Call):
    """The exp family in the native kernels: exp_forward in one of kernels/cpp/table.h's
    pass structures, exp_backward (with the parameters' gradients, summed over rows, where
    the function has parameters)."""

    structure: str = "FUSED"

    def bind(self, computes: ExpSpec, mode: str) -> Body:
        ext = native.load()
        mask, floor = computes.mask_negative, computes.floor
        tau0, offset0 = float(computes.tau), float(computes.offset or 0.0)
        if mode == "fwd":
            structure = getattr(ext.Structure, self.structure)

            def forward(x: Tensor, tau: float = tau0, offset: float = offset0) -> Tensor:
                return ext.exp_forward(x, structure, mask, floor, float(tau), float(offset))
            return forward

        def backward(x: Tensor, y: Tensor, g: Tensor, *params: float) -> Any:
            tau, offset = params or (tau0, offset0)
            dx, dtau, doffset = ext.exp_backward(x, y, g, mask, float(tau), float(offset),
                                                 bool(params))
            return (dx, dtau.sum(), doffset.sum()) if params else dx
        return backward


@dataclass(frozen=True)
class NativeWeight(Call):
    """The weight family in the native kernels: weight_forward."""

    def bind(self, computes: WeightSpec, mode: str) -> Body:
        ext, symax = native.load(), computes.symax

        def forward(x: Tensor, constant: float = 0.0) -> Tensor:
            return ext.weight_forward(x, symax, float(constant))
        return forward


# --- the torch code ---------------------------------------------------------------------


@dataclass(frozen=True)
class TorchExp(Call):
    """The exp family in torch: elasticbench.rows.exp_normalize, the torch tier of
    elasticbench.functional's autograd path, so the kernel verified is the code a model
    runs."""

    def bind(self, computes: ExpSpec, mode: str) -> Body:
        keep, floor = computes.keep, computes.floor
        tau0, offset0 = computes.tau, computes.offset
        if mode == "fwd":
            def forward(x: Tensor, tau: Any = tau0, offset: Any = offset0) -> Tensor:
                return exp_normalize_forward(x, keep(x), tau, offset, floor)
            return forward

        def backward(x: Tensor, y: Tensor, g: Tensor, *params: Any) -> Any:
            tau, offset = params or (tau0, offset0)
            dx, dtau, doffset = exp_normalize_backward(x, y, g, keep(x), tau, offset, floor,
                                                       params=bool(params))
            if not params:
                return dx
            assert dtau is not None and doffset is not None
            return dx, dtau.sum(), doffset.sum()
        return backward


def _work(x: Tensor) -> Tensor:
    """fp64 and fp32 compute in their own precision; fp16 and bf16 in fp32."""
    return x if x.dtype in (torch.float64, torch.float32) else x.float()


def _stablemax_weight(xw: Tensor) -> Tensor:
    return torch.where(xw >= 0, xw + 1, 1 / (1 - xw))


def _weight_normalize(x: Tensor, w: Tensor, constant: float = 0.0) -> Tensor:
    """w / (constant + sum w) for weights w >= 0, rounded once to x's dtype: rows whose
    largest weight exceeds 1 are scaled by it first, so neither the sum nor constant/scale
    can overflow; 0/0 gives 0, NaN rows stay NaN (docs/definitions.md section 3)."""
    nan_row = w.isnan().any(dim=-1, keepdim=True)
    w = w.nan_to_num(nan=0.0, posinf=math.inf)
    top = w.amax(dim=-1, keepdim=True)
    inf_row = top == math.inf
    scale = torch.where((top > 1) & ~inf_row, top, 1)
    ws = torch.where(inf_row, (w == math.inf).to(w.dtype), w / scale)
    den = ws.sum(dim=-1, keepdim=True) + torch.where(inf_row, 0, constant / scale)
    y = torch.where(den > 0, ws / torch.where(den > 0, den, 1), 0)
    return y.masked_fill(nan_row, math.nan).to(x.dtype)


@dataclass(frozen=True)
class TorchWeight(Call):
    """The weight family in torch (the library has no weight-family rows): weights scaled
    by the row's largest before summing."""

    def bind(self, computes: WeightSpec, mode: str) -> Body:
        weight = Tensor.abs if computes.symax else _stablemax_weight

        def forward(x: Tensor, constant: float = 0.0) -> Tensor:
            return _weight_normalize(x, weight(_work(x)), constant)
        return forward


# --- the Triton row kernels (elasticbench.kernels.triton; docs/triton.md) ----------------


@dataclass(frozen=True)
class Triton(Call):
    """A wrapper of elasticbench.kernels.triton, `<module>.<function>`: a forward takes (x,
    *params), a backward (y, g, x, *params). Each takes 2-D fp32, fp16 or bf16 rows and
    launches with the current LaunchOptions."""

    function: str

    def bind(self, computes: Computes, mode: str) -> Body:
        module, _, name = self.function.rpartition(".")
        call = getattr(importlib.import_module(f"elasticbench.kernels.triton.{module}"), name)
        if mode == "fwd":
            return call

        def backward(x: Tensor, y: Tensor, g: Tensor, *params: float) -> Any:
            return call(y, g, x, *params)
        return backward

    def formats(self) -> tuple[str, ...]:
        from elasticbench.kernels.triton.launch import DTYPES  # imported once Triton is here

        return DTYPES


# --- the public API (api_kernels.py describes what each call times) ----------------------

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


def wraps_raw(function: str, mode: str) -> Callable[[Callable], Callable]:
    """Decorator: declare (fn.wraps, read by elasticbench.harness.bench.models.wrapped_kernel)
    the raw kernel fn's call runs, resolved when asked."""
    def deco(fn: Callable) -> Callable:
        fn.wraps = functools.partial(raw_kernel, function, mode)  # type: ignore[attr-defined]
        return fn
    return deco


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
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


def _module_for(x: Tensor, tau: float, beta: float) -> ElasticSoftmax:
    return _module(str(x.device), _work_dtype(x.dtype), float(tau), float(beta))


class _Graph:
    """A forward's output and the tensors its backward is taken to: x's leaf, then tau and
    beta as the module computed them, then the module's learned log-scales."""

    def __init__(self, x: Tensor, tau: float, beta: float):
        module = _module_for(x, tau, beta)
        self.x = x.detach().requires_grad_()
        with torch.enable_grad():
            t = module.tau
            b = module.beta if module.learn_beta else module.beta.detach().requires_grad_()
            self.y = elastic_softmax(self.x, t, b, dim=module.dim)  # module.forward's call
        self.inputs = (self.x, t, b, *module.parameters())
        self.saved: weakref.ref | None = None  # the y the graph's output holds

    def hold(self, y: Tensor) -> None:
        """Make the output the backward reads y's values (api_kernels.py says why)."""
        if self.saved is None or self.saved() is not y:
            self.y.data.copy_(y)
            self.saved = weakref.ref(y)


_graphs: WeakIdKeyDictionary = WeakIdKeyDictionary()  # x -> {(tau, beta): _Graph}


def _api_forward(x: Tensor, tau: float, beta: float) -> Tensor:
    with torch.enable_grad():
        return _module_for(x, tau, beta)(x)


def _api_backward(x: Tensor, y: Tensor, g: Tensor, tau: float, beta: float) -> Any:
    per_x = _graphs.setdefault(x, {})
    key = (float(tau), float(beta))
    graph = per_x.get(key) or per_x.setdefault(key, _Graph(x, *key))
    graph.hold(y)
    dx, dtau, dbeta, *_ = torch.autograd.grad(graph.y, graph.inputs, g, retain_graph=True)
    return dx, dtau, dbeta


@dataclass(frozen=True)
class Api(Call):
    """elasticbench.nn.ElasticSoftmax as a training step calls it (Elastic-Softmax only):
    the forward with learnable tau and beta, the backward through autograd to x and the
    module's parameters. Declares the raw kernel it runs (`wraps`)."""

    def bind(self, computes: ExpSpec, mode: str) -> Body:
        return _api_forward if mode == "fwd" else _api_backward

    def declare(self, fn: Callable, function: str, mode: str) -> None:
        wraps_raw(function, mode)(fn)


# --- the tables ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Library:
    """Where a library's kernels register: their backend and whether they compile per
    shape (None: the backend's default, Backend.compiles)."""

    backend: str
    compiles: bool | None = None


LIBRARIES = {"cpp": Library("cpp"), "torch": Library("torch", compiles=False),
             "triton": Library("triton"), "api": Library("torch", compiles=False)}


@dataclass(frozen=True)
class Kernel:
    """One registered kernel of a row function: its library (LIBRARIES), name, the library
    call it runs, mode, pass model, formats (None: the call's) and docstring."""

    library: str
    name: str
    call: Call
    doc: str
    mode: str = "fwd"
    model: PassModel | None = None
    dtypes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Row:
    """A row function, what it computes as the library's calls take it, and its kernels."""

    function: str
    computes: Computes
    kernels: tuple[Kernel, ...]


FUSED = PassModel("fused", reads=2, writes=2, exps=1)  # exps stored in y, rescaled in cache
ONLINE = PassModel("online", reads=2, writes=1, exps=2)
TWO_PASS = PassModel("two-pass", reads=2, writes=1, exps=0)  # max and sum, then write
BACKWARD = PassModel("two-pass", reads=4, writes=1, exps=0)  # c = sum g y, max y; then dx

ROWS: tuple[Row, ...] = (
    Row("elastic", exp.ELASTIC, (
        Kernel("cpp", "cpp_elastic", NativeExp("FUSED"), model=FUSED, doc=(
            "Native Elastic-Softmax, fused: one exponential per element, y rescaled in "
            "cache.")),
        Kernel("cpp", "cpp_elastic_online", NativeExp("ONLINE"), model=ONLINE, doc=(
            "Native Elastic-Softmax, online: block max and rescaled sum in one sweep, then "
            "write.")),
        Kernel("cpp", "cpp_elastic_three_pass", NativeExp("THREE_PASS"),
               model=PassModel("three-pass", reads=3, writes=1, exps=2),
               doc="Native Elastic-Softmax, three sweeps: max, sum of exps, write."),
        Kernel("cpp", "cpp_elastic_accurate", NativeExp("ACCURATE"), dtypes=("fp64", "fp32"),
               model=PassModel("fused", reads=2, writes=1, exps=1, compute="fp64"),
               doc="Native Elastic-Softmax computed in fp64 and rounded once: <= 1 ulp in fp32."),
        Kernel("cpp", "cpp_elastic_bwd", NativeExp(), mode="bwd",
               model=PassModel("two-pass", reads=5, writes=1, exps=0),
               doc="Native Elastic-Softmax backward: dx, dtau and dbeta."),
        Kernel("torch", "torch_elastic", TorchExp(), doc=(
            "Elastic-Softmax in torch: mask, shift by the kept max, offset rescaled by "
            "exp(-m/tau).")),
        Kernel("torch", "torch_elastic_bwd", TorchExp(), mode="bwd", doc=(
            "Elastic-Softmax backward: dx, dtau, dbeta in one pass over y (1/D' read as max "
            "y).")),
        Kernel("triton", "triton_elastic", Triton("exp_family.elastic_forward"), doc=(
            "Elastic-Softmax in Triton: NVM mask, shift by the kept max, beta rescaled by "
            "exp(-m/tau).")),
        Kernel("triton", "triton_elastic", Triton("elastic_backward.elastic_backward"),
               mode="bwd", doc=(
                   "Elastic-Softmax backward in Triton: dx, and dtau, dbeta summed over the "
                   "whole tensor.")),
        Kernel("api", "api_elastic", Api(), doc=(
            "elasticbench.nn.ElasticSoftmax as a training forward calls it: learnable tau, "
            "beta.")),
        Kernel("api", "api_elastic", Api(), mode="bwd", doc=(
            "ElasticSoftmax's backward through autograd: dx, dtau, dbeta (forward once per "
            "x).")),
    )),
    Row("softmax", exp.SOFTMAX, (
        Kernel("cpp", "cpp_softmax", NativeExp(), model=FUSED,
               doc="Native safe softmax (fused); an all -inf row gives zeros."),
        Kernel("cpp", "cpp_softmax_bwd", NativeExp(), mode="bwd", model=BACKWARD,
               doc="Native softmax backward: y (g - sum g y); zeros on all -inf rows."),
        Kernel("torch", "torch_safe_softmax", TorchExp(),
               doc="Safe softmax in torch: shifted by the max; an all -inf row gives zeros."),
        Kernel("torch", "torch_safe_softmax_bwd", TorchExp(), mode="bwd", doc=(
            "Softmax backward: y (g - sum g y); zeros on all -inf rows and -inf positions.")),
        Kernel("triton", "triton_softmax", Triton("exp_family.softmax_forward"),
               doc="Safe softmax in Triton: shifted by the max; an all -inf row gives zeros."),
    )),
    Row("softmax1", exp.SOFTMAX1, (
        Kernel("cpp", "cpp_softmax1", NativeExp(), model=FUSED,
               doc="Native softmax1 (fused): shift max(max x, 0), the 1 rescaled to exp(-m)."),
        Kernel("cpp", "cpp_softmax1_bwd", NativeExp(), mode="bwd", model=BACKWARD,
               doc="Native softmax1 backward: y (g - sum g y), as softmax."),
        Kernel("torch", "torch_softmax1", TorchExp(),
               doc="Softmax1 in torch: shift m = max(max x, 0), the 1 rescaled to exp(-m)."),
        Kernel("torch", "torch_softmax1_bwd", TorchExp(), mode="bwd", doc=(
            "Softmax1 backward: y (g - sum g y), the same form as softmax (the 1 is a "
            "constant).")),
        Kernel("triton", "triton_softmax1", Triton("exp_family.softmax1_forward"),
               doc="Softmax1 in Triton: shift m = max(max x, 0), the 1 rescaled to exp(-m)."),
    )),
    Row("stablemax", WeightSpec(symax=False), (
        Kernel("cpp", "cpp_stablemax", NativeWeight(), model=TWO_PASS, doc=(
            "Native stablemax: max and sum of weights in one sweep (fp64 sum), then write.")),
        Kernel("torch", "torch_stablemax", TorchWeight(),
               doc="Stablemax in torch, weights scaled by the row maximum before summing."),
        Kernel("triton", "triton_stablemax", Triton("weight_family.stablemax_forward"), doc=(
            "Stablemax in Triton, weights scaled by a power of two near the row maximum.")),
    )),
    Row("symax", WeightSpec(symax=True), (
        Kernel("cpp", "cpp_symax", NativeWeight(), model=TWO_PASS,
               doc="Native symax: |x| / (eta + sum |x|), max and sum in one sweep, then write."),
        Kernel("torch", "torch_symax", TorchWeight(),
               doc="Symax in torch: |x| / (eta + sum |x|), scaled by max |x| before summing."),
        Kernel("triton", "triton_symax", Triton("weight_family.symax_forward"), doc=(
            "Symax in Triton: |x| / (eta + sum |x|), scaled by a power of two near max "
            "|x|.")),
    )),
)


def register_rows(library: str, namespace: dict[str, Any]) -> None:
    """Register the library's kernels of every row function: the forwards in ROWS' order,
    then the backwards (the registry's order). namespace is the calling module's globals():
    each kernel function becomes an attribute of that module and names it as its own."""
    if library not in LIBRARIES:
        raise ValueError(f"unknown library {library!r} (choose from {', '.join(LIBRARIES)})")
    for mode in MODES:
        for row in ROWS:
            for kernel in row.kernels:
                if kernel.library == library and kernel.mode == mode:
                    _register(row, kernel, namespace)


def _register(row: Row, kernel: Kernel, namespace: dict[str, Any]) -> None:
    lib = LIBRARIES[kernel.library]
    params = get_function(row.function).param_names
    fn = _kernel(kernel.call.bind(row.computes, kernel.mode), kernel.mode, params)
    name = kernel.name
    fn.__name__ = fn.__qualname__ = (name if kernel.mode == "fwd" or name.endswith("_bwd")
                                     else f"{name}_bwd")
    fn.__module__ = namespace["__name__"]
    fn.__doc__ = kernel.doc
    fn.__signature__ = _signature(kernel.mode, params)  # type: ignore[attr-defined]
    kernel.call.declare(fn, row.function, kernel.mode)
    namespace[fn.__name__] = fn
    dtypes = kernel.dtypes if kernel.dtypes is not None else kernel.call.formats()
    register_kernel(function=row.function, backend=lib.backend, name=name, mode=kernel.mode,
                    dtypes=dtypes, model=kernel.model, compiles=lib.compiles)(fn)


def _kernel(body: Body, mode: str, params: tuple[str, ...]) -> Callable[..., Any]:
    """The kernel function: the contract's call, fn(x, **params) or fn(x, y, g, **params),
    handed to body with the parameters' values in the function's order."""
    take = _taker(params)
    if mode == "fwd":
        def forward(x: Tensor, **kw: Any) -> Any:
            return body(x, *take(kw, forward.__name__))
        return forward

    def backward(x: Tensor, y: Tensor, g: Tensor, **kw: Any) -> Any:
        return body(x, y, g, *take(kw, backward.__name__))
    return backward


def _taker(params: tuple[str, ...]) -> Callable[[dict[str, Any], str], list[Any]]:
    """take(kw, fname) -> the values of params in order; TypeError, as Python words it, for
    a missing parameter or a keyword the function does not take."""
    expected = frozenset(params)

    def take(kw: dict[str, Any], fname: str) -> list[Any]:
        if kw.keys() != expected:
            unknown = sorted(set(kw) - expected)
            if unknown:
                raise TypeError(f"{fname}() got an unexpected keyword argument {unknown[0]!r}")
            missing = sorted(expected - set(kw))[0]
            raise TypeError(f"{fname}() missing 1 required keyword-only argument: "
                            f"{missing!r}")
        return [kw[p] for p in params]
    return take


def _signature(mode: str, params: tuple[str, ...]) -> inspect.Signature:
    """(x, *, <params>) forward, (x, y, g, *, <params>) backward: what the contract calls."""
    P = inspect.Parameter
    arrays = ("x",) if mode == "fwd" else ("x", "y", "g")
    return inspect.Signature(
        [P(n, P.POSITIONAL_OR_KEYWORD, annotation=Tensor) for n in arrays]
        + [P(n, P.KEYWORD_ONLY, annotation=float) for n in params])


__all__ = ["LIBRARIES", "RAW", "ROWS", "Api", "Call", "Kernel", "Library", "NativeExp",
           "NativeWeight", "Row", "TorchExp", "TorchWeight", "Triton", "WeightSpec",
           "raw_kernel", "register_rows", "wraps_raw"]
