"""Adversarial attention inputs: q, k, v drawn together, named, seeded and reproducible.

As for rows (generators.py), values are drawn in float64 and rounded to the format, so each
converts exactly to mpmath, and the seed stream depends on (seed, name, dtype, shape) only.
A shape is (batch, heads, length_q, length_k, head_dim); v has head_dim columns too. What
each input is for (docs/attention.md section 5):

- scores of both signs (normal), all negative (every query keeps nothing), a causal first
  query whose only visible key is negative while later keys are positive (a kernel that
  masks after shifting, or that ignores the causal mask when keeping, differs there);
- ties (equal keys), huge scores (the shift must keep every exponential finite), a NaN in
  q, in k or in v, placed so that it reaches some queries and not others;
- for the family's other weights (docs/attention.md section 9): rows and columns of exact 0
  scores, infinite scores, scores near 0 (symax's and stablemax's kinks); for cog's signed
  weights, scores straddling 0 and ties in |s| of opposite signs (s and -s in one row);
- masks (`generate_mask`): key padding, a random bool mask, a finite float mask that flips
  scores' signs, each leaving some queries with no key;
- gates (`generate_gate`): the gate tensor of a gated case, values in (0, 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from elasticbench.harness.inputs.generators import stream_seed
from elasticbench.harness.numerics.dtypes import FloatFormat, get_format

Shape = tuple[int, int, int, int, int]  # batch, heads, length_q, length_k, head_dim
QKV = tuple[np.ndarray, np.ndarray, np.ndarray]
Draw = Callable[[np.random.Generator, FloatFormat, Shape], QKV]


@dataclass(frozen=True)
class AttentionGenerator:
    name: str
    summary: str
    draw: Draw  # float64 q, k, v; rounded to the format by `generate_qkv`


ATTENTION_GENERATORS: dict[str, AttentionGenerator] = {}


def _generator(name: str, summary: str) -> Callable[[Draw], Draw]:
    def deco(fn: Draw) -> Draw:
        ATTENTION_GENERATORS[name] = AttentionGenerator(name, summary, fn)
        return fn
    return deco


def _normal(rng: np.random.Generator, shape: Shape) -> QKV:
    b, h, lq, lk, d = shape
    return (rng.standard_normal((b, h, lq, d)), rng.standard_normal((b, h, lk, d)),
            rng.standard_normal((b, h, lk, d)))


@_generator("normal", "q, k, v standard normal: scores of both signs")
def _normal_qkv(rng, fmt, shape):
    return _normal(rng, shape)


@_generator("all_negative", "every score negative (q < 0 < k): every query keeps nothing")
def _all_negative(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    return -np.abs(q) - 0.125, np.abs(k) + 0.125, v


@_generator("causal_hidden", "causally, query 0 sees one negative score, later keys positive")
def _causal_hidden(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    q[:, :, 0] = np.abs(q[:, :, 0]) + 0.125
    k[:, :, 0] = -np.abs(k[:, :, 0]) - 0.125  # key 0: negative for query 0
    k[:, :, 1:] = np.abs(k[:, :, 1:]) + 0.125  # every later key: positive for query 0
    return q, k, v


@_generator("ties", "repeated keys and queries: equal scores, equal maxima")
def _ties(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    k[:, :, 1::2] = k[:, :, 0:1]  # every other key repeats key 0
    q[:, :, 1::2] = q[:, :, 0:1]
    return q, k, v


@_generator("huge", "scores in the hundreds: exp(s / tau) overflows without the shift")
def _huge(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    d = shape[4]
    # with scale 1/sqrt(d), |q.k| * scale ~ 8 * 8 * sqrt(d): large but finite in every format
    return q * 8.0, k * 8.0 + 4.0 / np.sqrt(d), v


@_generator("nan_q", "a NaN in one query: that query's output is NaN, no other")
def _nan_q(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    q[0, 0, shape[2] // 2, 0] = np.nan
    return q, k, v


@_generator("nan_k", "a NaN in one key: NaN for the queries that see it (causally, the later)")
def _nan_k(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    k[0, -1, shape[3] // 2, -1] = np.nan
    return q, k, v


@_generator("nan_v", "a NaN in one value: NaN where that key has weight")
def _nan_v(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    v[-1, 0, shape[3] - 1, 0] = np.nan
    return q, k, v


@_generator("zero_scores", "a query and a key of zeros: a row of exact 0 scores (symax's 0/0 "
            "with eta = 0), a column of them, the rest normal")
def _zero_scores(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    q[:, :, shape[2] // 2] = 0.0
    k[:, :, 0] = 0.0  # causally, query 0 sees only this 0 score
    return q, k, v


@_generator("straddle_zero", "scores of both signs clustered about 0 (q scaled by 2^-3, "
            "one key of zeros): cog's signed weights near their jump at 0")
def _straddle_zero(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    k[:, :, shape[3] // 2] = 0.0
    return q * 0.125, k, v


@_generator("abs_ties", "every other key the negation of the one before: s and -s in one row, "
            "ties in |s| of opposite signs (cog's weights +p and -p)")
def _abs_ties(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    k[:, :, 1::2] = -k[:, :, 0:shape[3] - 1:2]
    return q, k, v


@_generator("inf_scores", "an infinite component in one query: its scores +-inf (the limits: "
            "equal shares among the infinite weights, sigmoid 1 and 0)")
def _inf_scores(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    q[0, 0, shape[2] // 2, 0] = np.inf  # k is normal: never 0, so no inf * 0
    return q, k, v


@_generator("near_zero", "scores near 0 (q scaled by 2^-10): symax's and stablemax's weights "
            "at the kink, an offset eta or a bias that dominates")
def _near_zero(rng, fmt, shape):
    q, k, v = _normal(rng, shape)
    return q * 2.0**-10, k, v


# Masks (docs/attention.md section 5). An input with a mask draws it from its own seed stream,
# so its q, k, v are those of `normal`; the mask is SDPA's attn_mask: bool (True takes part)
# or float (added to the scores), broadcastable to (batch, heads, length_q, length_k).
MaskDraw = Callable[[np.random.Generator, Shape], np.ndarray]
ATTENTION_MASKS: dict[str, MaskDraw] = {}


def _masked(name: str, summary: str) -> Callable[[MaskDraw], MaskDraw]:
    """Register an input of normal q, k, v under a mask drawn by the decorated function."""
    def deco(fn: MaskDraw) -> MaskDraw:
        ATTENTION_GENERATORS[name] = AttentionGenerator(name, summary, _normal_qkv)
        ATTENTION_MASKS[name] = fn
        return fn
    return deco


@_masked("key_padding", "a (B, 1, 1, Lk) key-padding mask: a kept prefix with a hole per "
         "batch, the last batch (of several) keeping no key")
def _key_padding(rng, shape):
    b, _, _, lk, _ = shape
    keep = np.arange(lk)[None, :] < rng.integers(1, lk + 1, size=(b, 1))
    keep[:, rng.integers(0, lk)] = False  # a hole (or one more padded key)
    if b > 1:
        keep[-1] = False
    return keep[:, None, None, :]


@_masked("bool_mask", "a random (B, H, Lq, Lk) bool mask, query 0 of every head keeping no key")
def _bool_mask(rng, shape):
    b, h, lq, lk, _ = shape
    keep = rng.random((b, h, lq, lk)) < 0.6
    keep[:, :, 0] = False
    return keep


@_masked("additive_mask", "a finite float mask added to the scores, flipping their signs; "
         "-1024 on query 0, which keeps no key")
def _additive_mask(rng, shape):
    b, h, lq, lk, _ = shape
    add = rng.standard_normal((b, h, lq, lk)) * 1.5
    add[:, :, 0] = -1024.0  # exact in every format
    return add


def generate_mask(name: str, dtype: str, shape: Shape, seed: int) -> np.ndarray | None:
    """The attn_mask of input `name` (None for an input without one), reproducible from
    seed; a float mask is rounded to the format, so the kernels get it exactly."""
    draw = ATTENTION_MASKS.get(name)
    if draw is None:
        return None
    mask = draw(np.random.default_rng(stream_seed(seed, f"attention/{name}/mask", dtype,
                                                  shape)), shape)
    return mask if mask.dtype == bool else get_format(dtype).cast(mask)


def mask_bias(mask: np.ndarray | None, shape: Shape) -> np.ndarray | None:
    """A mask as the reference takes it: float64 (B, H, Lq, Lk), -inf where a key is hidden,
    the value added to the score elsewhere (0 for a bool mask's kept keys)."""
    if mask is None:
        return None
    b, h, lq, lk, _ = shape
    bias = (np.where(mask, 0.0, -np.inf) if mask.dtype == bool
            else np.asarray(mask, dtype=np.float64))
    return np.ascontiguousarray(np.broadcast_to(bias, (b, h, lq, lk)))


def generate_gate(name: str, dtype: str, shape: Shape, seed: int) -> np.ndarray:
    """The gate of a gated case of input `name` (docs/attention.md section 5): (batch,
    heads, length_q, head_dim) in the format, sigmoid of N(0, 2^2) rounded to it, with the
    first query's values pushed near 0 and near 1 (sigmoid(-9), sigmoid(9)) in turn;
    every value in (0, 1) (one that rounds to 1 is the format's largest below 1)."""
    b, h, lq, _, d = shape
    fmt = get_format(dtype)
    rng = np.random.default_rng(stream_seed(seed, f"attention/{name}/gate", dtype, shape))
    x = rng.standard_normal((b, h, lq, d)) * 2.0
    x[:, :, 0, 0::2], x[:, :, 0, 1::2] = -9.0, 9.0
    g = fmt.cast(1.0 / (1.0 + np.exp(-x)))
    below_one = 1.0 - fmt.unit_roundoff  # the format's largest value below 1
    return np.where(g >= 1.0, fmt.cast(np.float64(below_one)), g).astype(g.dtype)


def padding_mask(batch: int, length: int, padded: float) -> np.ndarray:
    """(batch, 1, 1, length) bool: the last round(padded * length) keys of each batch
    hidden (a benchmark's key padding)."""
    kept = length - round(padded * length)
    return np.broadcast_to(np.arange(length) < kept, (batch, 1, 1, length)).copy()


def get_attention_generator(name: str) -> AttentionGenerator:
    try:
        return ATTENTION_GENERATORS[name]
    except KeyError:
        raise ValueError(f"unknown attention input {name!r} (choose from "
                         f"{', '.join(ATTENTION_GENERATORS)})") from None


def generate_qkv(name: str, dtype: str, shape: Shape, seed: int) -> QKV:
    """q, k, v of input `name` in format `dtype`, reproducible from seed."""
    if len(shape) != 5 or min(shape) < 1:
        raise ValueError(f"an attention shape is BxHxLQxLKxD, each >= 1; got {shape}")
    fmt = get_format(dtype)
    rng = np.random.default_rng(stream_seed(seed, f"attention/{name}", dtype, shape))
    q, k, v = get_attention_generator(name).draw(rng, fmt, shape)
    return fmt.cast(q), fmt.cast(k), fmt.cast(v)
