"""The family in Hugging Face transformers models, through transformers' AttentionInterface.

    from elasticbench.integrations import transformers as eb_hf
    model = LlamaForCausalLM(config)
    eb_hf.use_family(model, "elastic")       # per-head tau, beta on every attention layer
    model(...); model.generate(...)          # attention runs elasticbench.functional's

`register()` (idempotent; use_family calls it) registers one attention function per member
of the family under FAMILY's names (`elastic`, `softmax1`, `symax`, `stablemax`, `sigmoid`)
with transformers' AttentionInterface, and for each the boolean mask builder transformers'
`sdpa` uses with AttentionMaskInterface, so a model selecting one of these names builds the
same 4-D boolean masks (or None) that it builds for SDPA. After `register()`,
`attn_implementation="elastic"` works as any built-in name (from_config,
set_attn_implementation).

Each registered function takes what transformers' attention layers pass (module, query,
key, value, attention_mask, dropout=, scaling=, is_causal=, sliding_window=, softcap=,
**kwargs; q in (B, H, Lq, D), k and v in (B, Hkv, Lk, D)) and returns (output in
(B, Lq, H, Dv), None), computing elasticbench.functional's function of that name:

- parameters: those of the `family_attention` submodule use_family puts on the layer (an
  elasticbench.nn module: ElasticAttention's tau and beta, SymaxAttention's eta,
  SigmoidAttention's bias, per head, learned on elasticbench.nn's scales); a layer without
  one computes with the nn modules' initial values (tau = beta = 1, eta = 1), which
  nothing learns. Sigmoid's bias is -ln(n), n the config's max_position_embeddings (the
  context), plus the learned shift, not the functional default -ln(Lk): that would make a
  token's output depend on how many tokens follow it, so a cached decode and the full
  forward would differ.
- GQA (Hkv < H): a decode step (Lq = 1) whose parameters are the same for the query heads
  of a key head (none, one per layer, or param_shape "kv_head") takes the G = H // Hkv
  query heads of a key head as G queries of it: (B, Hkv, G, D) against the keys as they
  are, nothing copied. Otherwise, where the fused kernels run (below), the query heads of a key
  head are folded into the batch, (B Hkv, H // Hkv, ...), with the key head broadcast
  across them (a stride-0 view: the Triton kernel reads operands through their (batch,
  head) strides, kernels/triton/flash_attention.py, so it is not copied; the native CPU kernel
  makes its operands contiguous, so there the copy is made inside the call); per-head
  parameters fold the same way. Where a mask takes the materialized path (scores of
  H Lq Lk anyway), keys and values are repeated per query head, as transformers'
  repeat_kv does.
- masks: None is what transformers' SDPA path means by it: causal (top-left) when the layer
  is causal and Lq > 1, nothing hidden otherwise. A 4-D boolean mask that is exactly
  causal and/or key padding becomes causal=True and a (B, 1, 1, Lk) key-padding mask, which
  the fused kernels take (O(length) memory); a causal mask aligned bottom-right (a query
  block at the end of the cache) becomes causal="bottom_right" where the installed library
  takes it (`bottom_right_supported()`); any other mask is passed as attn_mask (the
  materialized path). A float mask's entries at or below half of its dtype's lowest value
  (transformers' "masked") hide their keys exactly (-inf): added as they are, symax would
  weigh |s - 3.4e38|.
- scaling is the scale (None: 1/sqrt(D)).
- q, k and v in different dtypes (under autocast a model's fp32 rotary embedding lifts q and
  k out of bf16, v stays) are cast to autocast's dtype, else to the three promoted, as
  SDPA takes them under autocast.
- refused with one ValueError line: softcap, dropout > 0 on a layer in training,
  sliding_window on a call without the mask that would express it, output_attentions,
  position_bias, attention sinks (s_aux).

Bit for bit: a call through the interface computes what elasticbench.functional's function
computes on the same q, keys repeated per query head, mask and parameters (the fold only
regroups independent (batch, head) slices); a packed GQA decode step, what it computes on
the packed layout ((B, Hkv, G, D) queries, the keys as they are), which is the repeated-keys
call within rounding (the native kernel may round a query differently beside others). `load_family_state` puts back the parameters
that transformers' from_pretrained drops. The library never imports this module, and this
module imports transformers only inside register() (docs/transformers.md).
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable

import torch
from torch import nn

from .. import functional as F
from ..attention.operands import head_params, visible
from ..nn import (
    ElasticAttention,
    SigmoidAttention,
    Softmax1Attention,
    StablemaxAttention,
    SymaxAttention,
)

FAMILY = ("elastic", "softmax1", "symax", "stablemax", "sigmoid")
PARAM_ATTR = "family_attention"  # the submodule of an attention layer holding its parameters

_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "elastic": F.elastic_attention,
    "softmax1": F.softmax1_attention,
    "symax": F.symax_attention,
    "stablemax": F.stablemax_attention,
    "sigmoid": F.sigmoid_attention,
}
_MODULES: dict[str, type[nn.Module]] = {
    "elastic": ElasticAttention,
    "softmax1": Softmax1Attention,
    "symax": SymaxAttention,
    "stablemax": StablemaxAttention,
    "sigmoid": SigmoidAttention,
}


def _check_name(name: str) -> str:
    if name not in FAMILY:
        raise ValueError(f"unknown attention {name!r}: the family's names are "
                         f"{', '.join(FAMILY)}")
    return name


# ------------------------------------------------------------------------- the attention


def _params(name: str, module: nn.Module | None, length_k: int) -> dict[str, object]:
    """The keyword parameters of `name`'s functional form from the layer's family_attention
    submodule (the nn modules' initial values where the layer has none)."""
    held = getattr(module, PARAM_ATTR, None) if module is not None else None
    if held is not None and not isinstance(held, _MODULES[name]):
        raise ValueError(f"the layer holds {type(held).__name__} parameters but attention "
                         f"{name!r} was asked: call use_family(model, {name!r})")
    if name == "elastic":
        if held is None:
            return {"tau": 1.0, "beta": 1.0}
        tau, beta = held.params()
        return {"tau": tau, "beta": beta}
    if name == "symax":
        return {"eta": 1.0 if held is None else held.eta}
    if name == "sigmoid":
        if held is None:
            return {"bias": _context_bias(module)}
        return {"bias": held.bias(length_k)}
    return {}


def _context_bias(module: nn.Module | None) -> float | None:
    """Sigmoid's bias -ln(n) for the model's context n (its config's
    max_position_embeddings), None (-ln(Lk) at each call) where it has none. -ln(Lk) would
    make a token's output depend on how many tokens follow it, so a cached decode and the
    full forward would differ."""
    n = getattr(getattr(module, "config", None), "max_position_embeddings", None)
    return -math.log(n) if isinstance(n, int) and n > 0 else None


def _refuse(name: str, module: nn.Module | None, dropout: float, softcap: float | None,
            sliding_window: int | None, mask: torch.Tensor | None, length_k: int,
            kwargs: dict) -> None:
    """One ValueError line for what the family's attention cannot honour."""
    what = f"elasticbench's {name} attention"
    if softcap is not None:
        raise ValueError(f"{what} cannot apply softcap (logit soft-capping): use a model "
                         "config without attn_logit_softcapping")
    if dropout and dropout > 0 and getattr(module, "training", True):
        raise ValueError(f"{what} has no attention dropout (dropout={dropout} in training): "
                         "set the config's attention dropout to 0")
    if sliding_window is not None and mask is None and length_k > sliding_window:
        raise ValueError(f"{what} got sliding_window={sliding_window} without a mask "
                         f"expressing it over {length_k} keys")
    if kwargs.get("output_attentions"):
        raise ValueError(f"{what} does not return attention weights (output_attentions): "
                         "use attn_implementation='eager' to inspect them")
    for key in ("position_bias", "s_aux"):
        if kwargs.get(key) is not None:
            raise ValueError(f"{what} cannot add {key} to the scores")


@functools.lru_cache(maxsize=1)
def bottom_right_supported() -> bool:
    """Whether the installed library's attention functions align causal="bottom_right" at
    the end of the keys: one query against two keys must see both (top-left would hide the
    second). Checked by its values, not its signature, since an older library reads any
    true value as top-left causal."""
    q = torch.ones(1, 1, 1, 1)
    k = torch.ones(1, 1, 2, 1)
    v = torch.tensor([0.0, 1.0]).reshape(1, 1, 2, 1)
    try:
        out = F.softmax1_attention(q, k, v, causal="bottom_right")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return bool(out.item() > 0)


def _float_mask(mask: torch.Tensor) -> torch.Tensor:
    """A float mask as a bool one where it only hides or keeps keys, else with its hidden
    entries (at or below half the dtype's lowest value, transformers' "masked") at -inf."""
    hidden = mask <= torch.finfo(mask.dtype).min / 2
    if bool(((mask == 0) | hidden).all()):
        return ~hidden
    return mask.masked_fill(hidden, -math.inf)


# The last mask _canonical read and its answer: a model passes the same mask tensor to every
# layer, so it is read once per forward (a weak reference, so it is not kept alive here).
_LAST: list = [None, None, None]


def _canonical(mask: torch.Tensor | None, lq: int, lk: int, causal: bool
               ) -> tuple[torch.Tensor | None, bool | str]:
    """(attn_mask, causal) for the functional call from transformers' mask: see module doc.
    A mask that is exactly causal and/or key padding leaves as causal and a (B, 1, 1, Lk)
    bool mask (None if no key is padded), which the fused kernels take."""
    if mask is None:
        return None, bool(causal and lq > 1)
    try:
        key = (mask._version, lq, lk)
    except RuntimeError:  # an inference-mode tensor keeps no version: read it each time
        return _read_mask(mask, lq, lk)
    if _LAST[0] is not None and _LAST[0]() is mask and _LAST[1] == key:
        return _LAST[2]
    answer = _read_mask(mask, lq, lk)
    _LAST[:] = [weakref.ref(mask), key, answer]
    return answer


def _read_mask(mask: torch.Tensor, lq: int, lk: int) -> tuple[torch.Tensor | None, bool | str]:
    """_canonical's answer for a mask, reading its values."""
    if mask.is_floating_point():
        mask = _float_mask(mask)
        if mask.is_floating_point():
            return mask, False
    if mask.dtype != torch.bool or mask.ndim != 4 or mask.shape[1:] != (1, lq, lk):
        return mask, False
    pad = mask[:, :, -1:, :]  # the last query sees every unpadded key under either causal
    if torch.equal(mask, pad.expand_as(mask)):
        return (None if bool(pad.all()) else pad), False
    if lq > lk:
        return mask, False
    if lq == lk:
        kind: bool | str = True
    elif bottom_right_supported():
        kind = "bottom_right"
    else:
        return mask, False
    tri = visible(lq, lk, mask.device, q0=lk - lq)  # bottom-right; top-left when lq == lk
    if torch.equal(mask, tri & pad):
        return (None if bool(pad.all()) else pad), kind
    return mask, False


def _fold_heads(value: object, batch: int, kv_heads: int, groups: int) -> object:
    """A parameter (a float, or a tensor of one value, one per head or broadcasting against
    (B, H, 1, 1)) laid out for (B Hkv, G) folded heads; one value stays as it is."""
    if not isinstance(value, torch.Tensor) or value.numel() == 1:
        return value
    heads = kv_heads * groups
    t = head_params(value, batch, heads, value.dtype, value.device)
    assert isinstance(t, torch.Tensor)
    return t.expand(batch, heads, 1, 1).reshape(batch * kv_heads, groups, 1, 1)


def _fold_mask(mask: torch.Tensor | None, batch: int, kv_heads: int, groups: int
               ) -> torch.Tensor | None:
    """A mask broadcasting against (B, H, Lq, Lk) for (B Hkv, G) folded heads."""
    if mask is None:
        return None
    m = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    if m.shape[:2] == (1, 1):
        return m
    if m.shape[1] == 1:  # one mask for every head of a batch row: each key head's copy
        m = m[:, None].expand(batch, kv_heads, 1, *m.shape[2:])
        return m.reshape(batch * kv_heads, 1, *m.shape[3:])
    m = m.expand(batch, kv_heads * groups, *m.shape[2:])
    return m.reshape(batch * kv_heads, groups, *m.shape[2:])


def _per_key_head(value: object, kv_heads: int, groups: int) -> bool:
    """Whether a parameter is the same for the query heads of each key head: a float, one
    value, or one per key head ((Hkv,) with Hkv < H, param_shape "kv_head")."""
    if not isinstance(value, torch.Tensor) or value.numel() == 1:
        return True
    return groups > 1 and value.ndim == 1 and value.shape[0] == kv_heads


def _per_query_head(value: object, kv_heads: int, groups: int) -> object:
    """A parameter of one value per key head as one per query head (each key head's value
    for its query heads, differentiably); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.numel() > 1 and groups > 1 and (
            value.ndim == 1 and value.shape[0] == kv_heads):
        return value.repeat_interleave(groups)
    return value


def _fused(mask: torch.Tensor | None, length_k: int) -> bool:
    """Whether the functional call with this mask takes the fused kernels: no mask, or a
    bool key-padding mask (elasticbench.attention.operands.key_padding)."""
    return mask is None or (mask.dtype == torch.bool and mask.ndim == 4
                            and mask.shape[1:] == (1, 1, length_k))


def _same_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v in one dtype, as SDPA takes them under autocast: a model's rotary embedding
    in fp32 can lift q and k out of autocast's bf16 while v stays in it. Under autocast,
    autocast's dtype; else the three promoted together. Unchanged when they agree."""
    if q.dtype == k.dtype == v.dtype:
        return q, k, v
    device = q.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _attention(name: str, module: nn.Module | None, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
               scaling: float | None = None, is_causal: bool | None = None,
               sliding_window: int | None = None, softcap: float | None = None,
               **kwargs) -> tuple[torch.Tensor, None]:
    """The registered function of `name` (module doc): (B, Lq, H, Dv) output and None."""
    batch, heads, lq, _ = query.shape
    kv_heads, lk = key.shape[1], key.shape[2]
    _refuse(name, module, dropout, softcap, sliding_window, attention_mask, lk, kwargs)
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key heads evenly")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    query, key, value = _same_dtype(query, key, value)
    mask, causal = _canonical(attention_mask, lq, lk, bool(is_causal))
    params = _params(name, module, lk)
    groups = heads // kv_heads
    if groups > 1 and lq == 1 and _fused(mask, lk) and all(
            _per_key_head(x, kv_heads, groups) for x in params.values()):
        # a decode step: a key head's G query heads are G queries of it (no key is copied);
        # one query sees every unmasked key, so nothing causal is lost
        q = query.reshape(batch, kv_heads, groups, query.shape[3])
        out = _FUNCTIONS[name](q, key, value, scale=scaling, causal=False, attn_mask=mask,
                               **params)
        out = out.reshape(batch, heads, lq, value.shape[3])
        return out.transpose(1, 2).contiguous(), None
    params = {p: _per_query_head(x, kv_heads, groups) for p, x in params.items()}
    q, k, v = query, key, value
    if groups > 1 and not _fused(mask, lk):
        # the materialized path: the scores cost H Lq Lk anyway, so keys are repeated per
        # query head, and the call is the functional one on the same shapes, bit for bit
        k, v = (x[:, :, None].expand(batch, kv_heads, groups, *x.shape[2:])
                .reshape(batch, heads, *x.shape[2:]) for x in (key, value))
    elif groups > 1:
        q = query.reshape(batch * kv_heads, groups, lq, query.shape[3])
        k = key.reshape(batch * kv_heads, 1, lk, key.shape[3]).expand(-1, groups, -1, -1)
        v = value.reshape(batch * kv_heads, 1, lk, value.shape[3]).expand(-1, groups, -1, -1)
        params = {p: _fold_heads(x, batch, kv_heads, groups) for p, x in params.items()}
        mask = _fold_mask(mask, batch, kv_heads, groups)
    out = _FUNCTIONS[name](q, k, v, scale=scaling, causal=causal, attn_mask=mask, **params)
    out = out.reshape(batch, heads, lq, value.shape[3])
    return out.transpose(1, 2).contiguous(), None


def attention_function(name: str) -> Callable[..., tuple[torch.Tensor, None]]:
    """The function register() registers under `name` (an AttentionInterface function)."""
    _check_name(name)
    return _REGISTERED[name]


def _make(name: str) -> Callable[..., tuple[torch.Tensor, None]]:
    def forward(module, query, key, value, attention_mask, **kwargs):
        return _attention(name, module, query, key, value, attention_mask, **kwargs)

    forward.__name__ = f"{name}_attention_forward"
    forward.__doc__ = f"elasticbench's {name} attention for transformers (module doc)."
    return forward


_REGISTERED = {name: _make(name) for name in FAMILY}


# ---------------------------------------------------------------------- registration


def register() -> None:
    """Register every name of FAMILY with transformers' AttentionInterface (and SDPA's mask
    builder with AttentionMaskInterface); calling it again changes nothing."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, fn in _REGISTERED.items():
        if AttentionInterface._global_mapping.get(name) is not fn:
            AttentionInterface.register(name, fn)
        if AttentionMaskInterface._global_mapping.get(name) is not sdpa_mask:
            AttentionMaskInterface.register(name, sdpa_mask)


def attention_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each attention layer that dispatches through AttentionInterface:
    a module with a config, a layer index and a head dimension, as transformers' attention
    classes hold them (LlamaAttention, GPT2Attention, ...)."""
    return [(n, m) for n, m in model.named_modules()
            if all(hasattr(m, a) for a in ("config", "layer_idx", "head_dim"))
            and not isinstance(m, nn.ModuleList)]


def _heads(layer: nn.Module) -> int:
    for attr in ("num_heads", "num_attention_heads"):
        if isinstance(getattr(layer, attr, None), int):
            return getattr(layer, attr)
    return int(layer.config.num_attention_heads)


def _kv_heads(layer: nn.Module, heads: int) -> int:
    groups = getattr(layer, "num_key_value_groups", 1)
    return heads // groups if isinstance(groups, int) and groups > 0 else heads


def _param_shape(param_shape: str | tuple[int, ...], layer: nn.Module) -> tuple[int, ...]:
    heads = _heads(layer)
    if param_shape == "head":
        return (heads,)
    if param_shape == "kv_head":
        return (_kv_heads(layer, heads),)
    if param_shape == "layer":
        return ()
    if isinstance(param_shape, tuple) and all(isinstance(n, int) for n in param_shape):
        return param_shape
    raise ValueError(f"param_shape must be 'head', 'kv_head', 'layer' or a tuple of ints, "
                     f"got {param_shape!r}")


def _new_module(name: str, shape: tuple[int, ...], learnable: bool, tau: float, beta: float,
                eta: float, bias: float | None) -> nn.Module | None:
    if name == "elastic":
        return ElasticAttention(tau=tau, beta=beta, learnable=learnable, param_shape=shape)
    if name == "symax":
        return SymaxAttention(eta=eta, learnable=learnable, param_shape=shape)
    if name == "sigmoid":
        return SigmoidAttention(bias=bias, learnable=learnable, param_shape=shape)
    return None  # softmax1 and stablemax have no parameter


def _held_shape(module: nn.Module) -> tuple[int, ...]:
    """The param_shape an elasticbench.nn module was built with."""
    return tuple(getattr(module, "param_shape", ()))


def use_family(model: nn.Module, name: str, *, param_shape: str | tuple[int, ...] = "head",
               learnable: bool = True, tau: float = 1.0, beta: float = 1.0, eta: float = 1.0,
               bias: float | None = None) -> nn.Module:
    """Switch `model` (a transformers PreTrainedModel) to the family's attention `name`.

    Registers the family (register()), gives each attention layer (attention_layers) a
    `family_attention` submodule holding its parameters, an elasticbench.nn module:
    ElasticAttention(tau, beta), SymaxAttention(eta) or SigmoidAttention(bias) with
    param_shape "head" (one value per query head, the default), "kv_head" (one per key
    head: a GQA model's query heads of one key head share it, and a decode step then reads
    the cached keys in place on every kernel), "layer" (one per layer) or a tuple, learned
    on nn's scales when learnable; softmax1 and stablemax have none. The
    submodules are ordinary parameters of the model (the optimizer, state_dict, save and
    load see them), on the device and in the floating dtype of the layer's own parameters.
    A layer already holding a module of the same kind and shape keeps it (and what it has
    learned); any other is replaced. Then sets the model's attention implementation
    (set_attn_implementation). Returns the model. ValueError (one line) for an unknown
    name, a bad param_shape, a model without attention layers, or one that does not
    switch.
    """
    _check_name(name)
    register()
    layers = attention_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no attention layer that dispatches "
                         "through transformers' AttentionInterface")
    for _, layer in layers:
        shape = _param_shape(param_shape, layer)
        held = getattr(layer, PARAM_ATTR, None)
        fresh = _new_module(name, shape, learnable, tau, beta, eta,
                            _context_bias(layer) if bias is None else bias)
        if fresh is None:
            if held is not None:
                delattr(layer, PARAM_ATTR)
            continue
        if isinstance(held, type(fresh)) and _held_shape(held) == shape:
            continue
        ref = next((p for p in layer.parameters() if p.is_floating_point()), None)
        if ref is not None:
            fresh = fresh.to(device=ref.device, dtype=ref.dtype)
        setattr(layer, PARAM_ATTR, fresh)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    if getattr(model.config, "_attn_implementation", None) != name:
        raise ValueError(f"{type(model).__name__} did not switch its attention to {name!r} "
                         "(its attention classes do not dispatch through AttentionInterface)")
    return model


def family_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The entries of model.state_dict() that use_family added (the `family_attention`
    submodules' parameters and buffers), by their state_dict names."""
    return {k: v for k, v in model.state_dict().items() if f".{PARAM_ATTR}." in f".{k}"}


def load_family_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load the family's parameters of `model` (after use_family) from a state dict holding
    them, such as a save_pretrained checkpoint's tensors: transformers' from_pretrained
    builds the layers without them and drops them as unexpected keys. Every entry
    family_state(model) names must be in `state` (ValueError, one line, naming the first
    one missing); nothing else of the model is touched."""
    wanted = family_state(model)
    if not wanted:
        raise ValueError("the model has no family parameters: call use_family first")
    missing = [k for k in wanted if k not in state]
    if missing:
        raise ValueError(f"{len(missing)} of the model's {len(wanted)} family entries are "
                         f"not in the state dict, the first {missing[0]!r}")
    model.load_state_dict({k: state[k] for k in wanted}, strict=False)


__all__ = ["FAMILY", "PARAM_ATTR", "attention_function", "attention_layers",
           "bottom_right_supported", "family_state", "load_family_state", "register",
           "use_family"]
