"""The registry's low level: what a registered kernel is (`KernelSpec`), the one registry
object, and `register_kernel`, the decorator kernel modules call on import.

This module imports no kernel module, so the built-in kernel modules (kernels/*.py) import
`register_kernel` from here; elasticbench.harness.registry, above both, loads them and answers the
questions (list_kernels, get_kernel, load_kernel_file). Users import `register_kernel` from
`elasticbench` itself, which is this same function.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from elasticbench.harness.backends import get_backend
from elasticbench.harness.functions import (
    ATTENTION,
    ROW,
    function_kind,
    get_attention_function,
    get_function,
)
from elasticbench.harness.numerics.contract import WIDE, check_accuracy
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.passes import PassModel

MODES = ("fwd", "bwd")
# How an attention kernel takes its row parameters (kinds/attention/kernel_contract.py): "heads", a
# (batch, heads) array in the working precision (the default); "float", a Python float;
# "own", a (batch, heads) array in the case's own format, the reference then using the
# value rounded to it.
PARAM_FORMS = ("heads", "float", "own")
# Where an attention kernel's causal diagonal lies when length_q != length_k: "top_left",
# key j visible to query i when j <= i (SDPA's is_causal, the default), or "bottom_right",
# when j <= i + length_k - length_q (FlashAttention's, decoding with a cache). The two agree
# when the lengths do (docs/attention.md sections 1 and 4).
TOP_LEFT, BOTTOM_RIGHT = "top_left", "bottom_right"
CAUSAL_CONVENTIONS = (TOP_LEFT, BOTTOM_RIGHT)

# How an unpickled KernelSpec finds its kernel in another process: f(name, mode, source),
# which loads the built-ins (and the kernel file `source`) there. elasticbench.harness.registry sets
# it on import, being the module that can load them; until then a spec pickles by value.
Resolver = Callable[[str, str, str], "KernelSpec"]
_resolver: Resolver | None = None


def set_resolver(resolve: Resolver) -> None:
    """Name the function that finds a registered kernel again after unpickling (a module
    attribute, so that pickle stores it by reference)."""
    global _resolver
    _resolver = resolve


@dataclass(frozen=True)
class KernelSpec:
    """A registered kernel: what it computes, on which backend, and the callable."""

    name: str
    function: str
    backend: str
    fn: Callable
    mode: str = "fwd"
    source: str = "builtin"
    description: str = ""
    baseline: bool = False  # a vendor reference point: timed by run, verified only by name
    dtypes: tuple[str, ...] | None = None  # formats it accepts; None: all of them
    model: PassModel | None = None  # its declared passes; None: its function's minimum
    accuracy: str = WIDE  # the contract its budgets come from (numerics/contract.py)
    compiles: bool = False  # compiles code per input shape (Backend.compiles)
    param_form: str = "heads"  # attention: how row parameters arrive (PARAM_FORMS)
    causal: str = TOP_LEFT  # attention: where its causal diagonal lies (CAUSAL_CONVENTIONS)

    @property
    def kind(self) -> str:
        """"row" (fn(x, **params)) or "attention" (fn(q, k, v, ...), docs/attention.md)."""
        return function_kind(self.function)

    def supports(self, dtype: str) -> bool:
        """Whether the kernel takes inputs of this format (others are skipped, not failed)."""
        return self.dtypes is None or dtype in self.dtypes

    def takes_layout(self, layout: str) -> bool:
        """Whether its backend's kernels must accept inputs in this layout (inputs/layouts.py)."""
        return layout in get_backend(self.backend).layouts

    def __reduce__(self):  # type: ignore[override]
        # A registered kernel travels to another process by name and is looked up (its
        # kernel file loaded) there: functions of a user's file do not pickle by reference.
        if _resolver is not None and REGISTRY.get(self.name, self.mode) is self:
            return (_resolver, (self.name, self.mode, self.source))
        return super().__reduce__()


class KernelRegistry:
    """Kernels by (name, mode), in registration order; `scoped` undoes what a block adds."""

    def __init__(self) -> None:
        self._kernels: dict[tuple[str, str], KernelSpec] = {}

    def get(self, name: str, mode: str) -> KernelSpec | None:
        return self._kernels.get((name, mode))

    def add(self, spec: KernelSpec) -> None:
        self._kernels[(spec.name, spec.mode)] = spec

    def specs(self) -> list[KernelSpec]:
        return list(self._kernels.values())

    @contextmanager
    def scoped(self, *, alone: bool = False) -> Iterator[None]:
        """Kernels registered inside the block are forgotten after it; alone=True also hides
        the ones registered before, for the block's duration."""
        saved = dict(self._kernels)
        if alone:
            self._kernels.clear()
        try:
            yield
        finally:
            self._kernels.clear()
            self._kernels.update(saved)


REGISTRY = KernelRegistry()
_loading_source = "builtin"
_loaded_keys: list[tuple[str, str]] | None = None  # what the file being loaded registers


@contextmanager
def registering_from(source: str) -> Iterator[list[tuple[str, str]]]:
    """Kernels registered inside the block get `source` (a kernel file's path) as theirs;
    the list it yields collects the (name, mode) of each, in order."""
    global _loading_source, _loaded_keys
    keys: list[tuple[str, str]] = []
    _loading_source, _loaded_keys = source, keys
    try:
        yield keys
    finally:
        _loading_source, _loaded_keys = "builtin", None


def register_kernel(
    *,
    function: str,
    backend: str,
    name: str | None = None,
    mode: str = "fwd",
    description: str = "",
    baseline: bool = False,
    dtypes: Iterable[str] | None = None,
    model: PassModel | None = None,
    accuracy: str = WIDE,
    compiles: bool | None = None,
    param_form: str = "heads",
    causal: str = TOP_LEFT,
) -> Callable[[Callable], Callable]:
    """Decorator: register fn as the kernel `name` (default: the function's __name__).

    baseline=True marks a vendor reference point (torch.softmax, say): `run` compares
    against it, and `verify` checks it only when it is named with --only. dtypes limits the
    formats the kernel is given (fp64 for a GPU kernel, say); by default all four. model
    declares its passes over memory and its exponentials (elasticbench.harness.passes), which give
    it its own roof in `run`. accuracy names the contract its budgets come from: "wide" (a
    16-bit kernel computes in fp32 and rounds once, the default) or "own" (every step rounds
    to its own format: for rows the shift, exponential, sum and division; for attention the
    scores, the weights and the weighted sum), numerics/contract.py. compiles says whether it
    compiles code for each input shape it meets (torch.compile, a JIT); by default, what its
    backend's kernels may do (Backend.compiles). param_form says how an attention kernel
    takes its row parameters (tau, beta...): "heads", (batch, heads) arrays in the working
    precision (fp32, fp64 for fp64 inputs; the default), "float", Python floats, or "own",
    (batch, heads) arrays in the case's dtype, the reference then computed with the values
    rounded to it (PARAM_FORMS, docs/attention.md section 4). causal says where an
    attention kernel's causal diagonal lies when the query and key lengths differ:
    "top_left" (SDPA's is_causal, the default) or "bottom_right" (FlashAttention's); the
    reference follows it (CAUSAL_CONVENTIONS).
    """
    kind = function_kind(function)
    check_accuracy(accuracy)
    if causal not in CAUSAL_CONVENTIONS:
        raise ValueError(f"unknown causal convention {causal!r} (choose from "
                         f"{', '.join(CAUSAL_CONVENTIONS)})")
    if causal != TOP_LEFT and kind != ATTENTION:
        raise ValueError("causal is for attention kernels (row kernels have no keys)")
    if param_form not in PARAM_FORMS:
        raise ValueError(f"unknown param_form {param_form!r} (choose from "
                         f"{', '.join(PARAM_FORMS)})")
    if param_form != "heads" and kind != ATTENTION:
        raise ValueError("param_form is for attention kernels (row kernels take their "
                         "parameters as floats)")
    per_shape = get_backend(backend).compiles if compiles is None else compiles
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
    if kind == ROW and mode == "bwd" and get_function(function).gradient_row is None:
        raise ValueError(f"{function} has no gradient, so it takes no backward kernel")
    formats = None if dtypes is None else tuple(get_format(d).name for d in dtypes)

    def deco(fn: Callable) -> Callable:
        kname = name or fn.__name__
        check_signature(fn, kname, function, mode)
        summary = description or (fn.__doc__ or "").strip().partition("\n")[0]
        spec = KernelSpec(kname, function, backend, fn, mode, _loading_source, summary, baseline,
                          formats, model, accuracy, per_shape, param_form, causal)
        old = REGISTRY.get(kname, mode)
        if _loaded_keys is not None:
            _loaded_keys.append((kname, mode))
        if old is not None and old.source != spec.source:
            if _same_definition(old.fn, fn):  # a module imported by two kernel files
                return fn
            raise ValueError(
                f"kernel {kname!r} ({mode}) is already registered by {old.source}"
            )
        REGISTRY.add(spec)
        return fn

    return deco


def contract_call(function: str, mode: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(positional arguments, keyword arguments) with which verify and run call a kernel of
    `function` in `mode`: a row kernel fn(x, **params) forward and fn(x, y, g, **params)
    backward (docs/guide/writing-a-kernel.md), an attention kernel fn(q, k, v, *, scale,
    causal, **row_params) in both modes (kinds/attention/kernel_contract.py). The optional
    mask keywords of attention (attn_mask, key_mask) are not in it: a kernel that declares
    neither is simply not given masked cases."""
    if function_kind(function) == ATTENTION:
        return ("q", "k", "v"), ("scale", "causal",
                                 *get_attention_function(function).row_params)
    return (("x",) if mode == "fwd" else ("x", "y", "g")), get_function(function).param_names


def check_signature(fn: Callable, name: str, function: str, mode: str) -> None:
    """ValueError, in one line, when fn cannot be called as the contract calls a kernel of
    `function` in `mode` (contract_call): a missing or an unknown parameter is found when
    the kernel registers, not once per case when it runs. A callable whose signature Python
    cannot read (a C function) is not checked."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    positional, keywords = contract_call(function, mode)
    try:
        sig.bind(*positional, **dict.fromkeys(keywords))
    except TypeError as e:
        call = ", ".join([*positional, *(["*"] if keywords else []), *keywords])
        mask = [m for m in ("attn_mask", "key_mask") if f"'{m}'" in str(e)]
        hint = (f" (cases without a mask do not pass {mask[0]}: give it a default, "
                f"{mask[0]}=None)" if mask else "")
        raise ValueError(f"kernel {name!r} ({mode}): its signature {name}{sig} does not take "
                         f"the call {function} {mode} kernels get, fn({call}): {e}{hint}"
                         ) from None


def _same_definition(a: Callable, b: Callable) -> bool:
    """Whether two functions come from the same lines of the same file (one module executed
    twice, under two names)."""
    ca, cb = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (ca is not None and cb is not None and ca.co_filename == cb.co_filename
            and ca.co_firstlineno == cb.co_firstlineno)
