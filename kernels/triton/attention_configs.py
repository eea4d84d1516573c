"""The Triton attention kernel's tile configurations, and the choice among them, cached.

A configuration (`Tiles`) is a launch's resident block, its streamed block, warps and pipeline
stages. Each of the three kernels (forward; backward dk/dv with keys resident; backward dq
with queries resident) has a list per (head dim class, 16-bit or fp32, causal). On Hopper the
16-bit lists hold only tiles whose dots Triton lowers to warpgroup MMA (wgmma: num_warps a
multiple of 4, each dot's M a multiple of 64) and that fit an SM's shared memory without
register spills: `tests/test_triton_attention.py` compiles every one of them for sm_90a and
fails on any that does not (docs/attention.md section 7). fp32 multiplies in IEEE fp32 on the
CUDA cores (no tensor-core instruction takes it), on small tiles.

On a GPU the first call per (kernel, head dims, dtype, causal, key mask, device capability)
times every configuration of its list on that call's operands (`triton.testing.do_bench`)
and keeps the fastest for the process; under Triton's interpreter, or with CPU tensors (the
compile audit's captured launches), the smallest configuration is taken, deterministically.

TMA: the 16-bit lists have a second form of tiles that move through tensor descriptors
(`Tiles.tma`), offered beside them (`offered`) where the installed Triton has descriptors
(`tma_available`) and the call's device and tensors allow them; the tuner picks either, the
interpreter the pointer form; $ELASTICBENCH_TRITON_ATTENTION_TMA=0 / 1 keeps one kind.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from elasticbench import launches
from elasticbench.attention.weights import Weight
from elasticbench.devices import triton_interpreted


@dataclass(frozen=True)
class Tiles:
    """block_m: rows of the resident block (queries; keys for dk/dv), block_n: rows of the
    streamed block, warps per program, software-pipeline stages; tma: q, k, v, dO and the
    outputs move through tensor descriptors (Hopper's TMA) instead of pointer tiles."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    tma: bool = False

    def __str__(self) -> str:
        tail = " tma" if self.tma else ""
        return f"{self.block_m}x{self.block_n} w{self.warps} s{self.stages}{tail}"


KERNELS = ("fwd", "dkdv", "dq")

# (kernel, head-dim class) -> 16-bit configurations, the first the one expected to win on an
# H100 (FlexAttention's and the Triton tutorial's H100 choices); _NOT_CAUSAL: those that
# compile without spills only without the causal mask's extra live values. 128 x 128 forward
# tiles and 128 x 64 dk/dv tiles spill in fp16 (8-480 B per thread) where bf16 does not, and
# 128 x 128 dq tiles at head dim 64 (184-288 B, since dq marks each maximum for dtau):
# off the lists, which are the same for both formats
_HALF: dict[tuple[str, int], tuple[Tiles, ...]] = {
    ("fwd", 64): (Tiles(128, 64, 4, 3), Tiles(128, 64, 8, 3), Tiles(64, 64, 4, 3),
                  Tiles(128, 64, 8, 4)),
    ("fwd", 128): (Tiles(128, 64, 8, 3), Tiles(128, 64, 8, 2), Tiles(64, 64, 4, 3),
                   Tiles(64, 64, 4, 2)),
    ("dkdv", 64): (Tiles(128, 32, 8, 3), Tiles(128, 32, 8, 2), Tiles(64, 32, 4, 3)),
    ("dkdv", 128): (Tiles(128, 32, 8, 3), Tiles(128, 32, 8, 2), Tiles(64, 32, 4, 3)),
    ("dq", 64): (Tiles(128, 64, 8, 2), Tiles(128, 32, 4, 3), Tiles(64, 64, 4, 3),
                 Tiles(128, 64, 8, 3)),
    ("dq", 128): (Tiles(128, 64, 8, 2), Tiles(128, 32, 8, 3), Tiles(64, 64, 4, 2),
                  Tiles(128, 32, 8, 2), Tiles(64, 32, 4, 3)),
}
_NOT_CAUSAL = {("fwd", 64, Tiles(128, 64, 4, 3))}
# (kernel, head-dim class, causal, weight, tiles) that spill for that weight alone (the
# compile audit, per weight, bytes per thread): symax's causal dk/dv 128x32 w8 s2 at 128 (24),
# and the 4-warp 128x64 forward at 64, already at 252 registers for Elastic (24 for sigmoid,
# stablemax in bf16, 8 for symax in fp16)
_SPILLS_FOR = {("dkdv", 128, True, Weight.SYMAX, Tiles(128, 32, 8, 2))} | {
    ("fwd", 64, False, w, Tiles(128, 64, 4, 3))
    for w in (Weight.SYMAX, Weight.STABLEMAX, Weight.SIGMOID)}
# (kernel, head-dim class, causal, tiles) that spill only with a key-padding mask (its flags
# hold more live values; the compile audit with padding, bytes per thread, bf16 and fp16
# alike): the pointer dk/dv's 128x32 w8 at 128 on 3 stages (24, causal 8) and causal on 2 (24)
_PADDED_SPILLS = {("dkdv", 128, False, Tiles(128, 32, 8, 3)),
                  ("dkdv", 128, True, Tiles(128, 32, 8, 3)),
                  ("dkdv", 128, True, Tiles(128, 32, 8, 2))}
# head dims above 128: one small tile, not tuned (audited neither)
_HALF_WIDE: dict[str, tuple[Tiles, ...]] = {
    "fwd": (Tiles(64, 32, 4, 2),), "dkdv": (Tiles(64, 32, 4, 2),), "dq": (Tiles(64, 32, 4, 2),)}
# fp32: 32 x 32 spills in dk/dv and dq at head dim 128 (their IEEE products keep fp32 tiles of
# 32 x 128 live), on 4 warps and on 8
_FP32: dict[str, tuple[Tiles, ...]] = {
    "fwd": (Tiles(32, 32, 4, 3),), "dkdv": (Tiles(32, 16, 8, 2),), "dq": (Tiles(32, 16, 4, 2),)}


# TMA: the 16-bit configurations that also run with tensor descriptors (the same tiles,
# tma=True), offered where the installed Triton has them (tma_available) and the call's
# tensors allow them; the compile audit holds them to the same rules plus TMA in the PTX.
# Off: the 4-warp 128x64 forward at 64 (254 registers causal with key padding), dq 128x32 w4
# s3 at 64 (16 B spilled causal with key padding); fp32 has none (its FMA products from
# descriptor-filled shared memory spill 300-2400 B per thread on every list)
_TMA_HALF: dict[tuple[str, int], tuple[Tiles, ...]] = {
    ("fwd", 64): (Tiles(128, 64, 8, 3), Tiles(64, 64, 4, 3), Tiles(128, 64, 8, 4)),
    ("fwd", 128): (Tiles(128, 64, 8, 3), Tiles(128, 64, 8, 2), Tiles(64, 64, 4, 3),
                   Tiles(64, 64, 4, 2)),
    ("dkdv", 64): (Tiles(128, 32, 8, 3), Tiles(128, 32, 8, 2), Tiles(64, 32, 4, 3)),
    ("dkdv", 128): (Tiles(128, 32, 8, 3), Tiles(128, 32, 8, 2), Tiles(64, 32, 4, 3)),
    ("dq", 64): (Tiles(128, 64, 8, 2), Tiles(64, 64, 4, 3), Tiles(128, 64, 8, 3)),
    ("dq", 128): (Tiles(128, 64, 8, 2), Tiles(128, 32, 8, 3), Tiles(64, 64, 4, 2),
                  Tiles(128, 32, 8, 2), Tiles(64, 32, 4, 3)),
}
# (kernel, head-dim class, dtype, causal, tiles) whose TMA form spills (bytes per thread):
# fp16's causal dk/dv at 128 on 3 stages (16, 24 with key padding; bf16 none)
_TMA_SPILLS = {("dkdv", 128, torch.float16, True, Tiles(128, 32, 8, 3)),
               ("dkdv", 128, torch.float16, True, Tiles(64, 32, 4, 3))}
TMA_ENV = "ELASTICBENCH_TRITON_ATTENTION_TMA"


def tma_available() -> bool:
    """Whether the installed Triton has device-side tensor descriptors and the allocator
    their global scratch needs (found by feature, not by version)."""
    import triton
    import triton.language as tl

    return hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")


def tma_mode() -> str | None:
    """$ELASTICBENCH_TRITON_ATTENTION_TMA: "1" TMA only, where the call allows it, "0"
    none; unset or empty, both kinds listed (the tuner picks)."""
    value = os.environ.get(TMA_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{TMA_ENV} must be 0, 1 or unset, got {value!r}")
    return value or None


def head_dim_class(head_dim: int) -> int:
    """64 for head dims up to 64, 128 up to 128, else the next power of two."""
    return max(64, 1 << max(0, (head_dim - 1).bit_length()))


def configs(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool,
            weight: Weight = Weight.ELASTIC, tma: bool = False,
            padded: bool = False) -> tuple[Tiles, ...]:
    """The configurations of `kernel` ("fwd", "dkdv" or "dq") for a head dim (the larger of
    q's and v's), an input dtype, causality and the weight (Weight); tma: only the TMA ones
    (empty where the installed Triton has no tensor descriptors, or the head dim none);
    padded: for a call with a key-padding mask."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    cls = head_dim_class(head_dim)
    if tma:
        if not tma_available() or dtype == torch.float32:
            return ()
        listed = tuple(Tiles(t.block_m, t.block_n, t.warps, t.stages, True)
                       for t in _TMA_HALF.get((kernel, cls), ())
                       if (kernel, cls, dtype, bool(causal), t) not in _TMA_SPILLS)
    elif dtype == torch.float32:
        return _FP32[kernel]
    else:
        listed = _HALF.get((kernel, cls), _HALF_WIDE[kernel])
    w = Weight(weight)
    return tuple(t for t in listed if not (causal and (kernel, cls, t) in _NOT_CAUSAL)
                 and (kernel, cls, bool(causal), w, t) not in _SPILLS_FOR
                 and not (padded and (kernel, cls, bool(causal), t) in _PADDED_SPILLS))


def offered(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool,
            weight: Weight = Weight.ELASTIC, tma: bool = False,
            padded: bool = False) -> tuple[Tiles, ...]:
    """What a call chooses among: the pointer configurations and, where tma (the call's
    device and tensors allow descriptors), the TMA ones. $ELASTICBENCH_TRITON_ATTENTION_TMA
    = 0 keeps the pointer ones; = 1 the TMA ones where tma, and where a list has none (fp32)
    its pointer tiles with descriptors: for verification, not speed (they spill on
    Hopper); without tma the pointer ones all the same (it never fails)."""
    mode = tma_mode()
    plain = configs(kernel, head_dim, dtype, causal, weight, padded=padded)
    if not tma or mode == "0":
        return plain
    with_tma = configs(kernel, head_dim, dtype, causal, weight, True, padded)
    if mode == "1":
        return with_tma or tuple(replace(t, tma=True) for t in plain)
    return plain + with_tma


def smallest(tiles: tuple[Tiles, ...]) -> Tiles:
    """The configuration the interpreter runs: the fewest elements per tile, then warps and
    stages (one choice for every run)."""
    return min(tiles, key=lambda t: (t.block_m * t.block_n, t.warps, t.stages, t.block_m,
                                     t.tma))


_CHOSEN: dict[tuple, Tiles] = {}
_LOCK = threading.Lock()


def choose(kernel: str, head_dim: int, q: torch.Tensor, causal: bool, has_mask: bool,
           time_one: Callable[[Tiles], float], weight: Weight = Weight.ELASTIC,
           tma: bool = False) -> Tiles:
    """The configuration for this call among `offered(...)` (tma: the call may use tensor
    descriptors): the smallest under the interpreter or on the CPU (pointer loads before
    TMA); on a GPU the fastest by `time_one(tiles)` (ms), timed once per key (the weight's
    and whether TMA was offered among them) and kept. A configuration whose launch fails
    (out of resources on this GPU) is skipped."""
    tiles = _choose(kernel, head_dim, q, causal, has_mask, time_one, weight, tma)
    launches.note(lambda: f"{kernel} {tiles}")
    return tiles


def _choose(kernel: str, head_dim: int, q: torch.Tensor, causal: bool, has_mask: bool,
            time_one: Callable[[Tiles], float], weight: Weight, tma: bool) -> Tiles:
    options = offered(kernel, head_dim, q.dtype, causal, weight, tma, has_mask)
    if triton_interpreted() or not q.is_cuda or len(options) == 1:
        return smallest(options)
    cap = torch.cuda.get_device_capability(q.device)
    key = (kernel, head_dim_class(head_dim), q.dtype, bool(causal), bool(has_mask), cap,
           int(weight), any(t.tma for t in options), all(t.tma for t in options))
    with _LOCK:
        if key not in _CHOSEN:
            timings = {}
            for t in options:
                try:
                    timings[t] = time_one(t)
                except Exception:  # out of shared memory on this GPU, say
                    timings[t] = math.inf
            best = min(timings, key=timings.__getitem__)
            if math.isinf(timings[best]):
                raise RuntimeError(f"no {kernel} attention configuration launches here")
            _CHOSEN[key] = best
        return _CHOSEN[key]


def chosen() -> dict[tuple, Tiles]:
    """The choices made so far in this process (for the sweep and reports)."""
    return dict(_CHOSEN)
