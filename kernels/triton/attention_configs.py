"""The Triton attention kernel's tile configurations, and the choice among them.

A configuration (`Tiles`) is a launch's resident block, its streamed block, warps and pipeline
stages. Each of the three kernels (forward; backward dk/dv with keys resident; backward dq
with queries resident) has a list per (head dim class, 16-bit or fp32, causal). On Hopper the
16-bit lists hold only tiles whose dots Triton lowers to warpgroup MMA (wgmma: num_warps a
multiple of 4, each dot's M a multiple of 64) and that fit an SM's shared memory without
register spills, with Triton 3.6.0 (the GPU machines') and 3.9.0 (the pinned one) alike:
`elasticbench audit --attention` compiles every one of them for sm_90a and fails on any that
does not (docs/attention.md section 7). fp32 multiplies in IEEE fp32 on the CUDA cores (no
tensor-core instruction takes it), on small tiles.

The choice (docs/attention.md section 7) is a lookup, never a timing inside a user's call: a
table (`Table`: the file in $ELASTICBENCH_ATTENTION_TABLE, read once at first use, then the
package's `tables/*.json`, written by `elasticbench tune` on a GPU) names the configuration
per `Key` (the GPU's capability and name, kernel, dtype, head-dim class, causal, key
padding, weight and a length class); a key no table has takes the rule (`rule`): the first
configuration of its pointer list (TMA only where ELASTICBENCH_TRITON_ATTENTION_TMA=1). Under
Triton's interpreter, or with CPU tensors (the compile audit's captured launches), the
smallest configuration runs. A given key maps to one configuration, in a process and across
processes. Timing on first use is opt-in ($ELASTICBENCH_ATTENTION_TUNE=1, read once), never
while the stream captures a CUDA graph, and swallows only the errors that mean "this
configuration does not fit" (`does_not_fit`).

TMA: the 16-bit lists have a second form of tiles that move through tensor descriptors
(`Tiles.tma`), offered beside them (`offered`) where the installed Triton has descriptors
(`tma_available`) and the call's device and tensors allow them; a table may name either, the
rule and the interpreter take the pointer form; $ELASTICBENCH_TRITON_ATTENTION_TMA=0 / 1
keeps one kind.

The family's other weights (softmax1, symax, stablemax, sigmoid, cog) are offered at most
two configurations per list, where Elastic has up to five: of what Elastic's list leaves them (less
what spills for them, `_SPILLS_FOR`), the rule's (the first) and the smallest (the
interpreter's, and a tile that fits where the larger does not), pointer and TMA lists alike
(`_family_trim`). The lists were chosen for Elastic and none of their configurations has run
on a GPU for any weight; a GPU session tunes Elastic's keys first (`elasticbench tune`:
144 keys at the two 16-bit dtypes and head dims 64 and 128), and the family's 720 more keys
with up to ten candidates each are more than a session times, so their further
candidates would only be audited, never chosen. Both the rule and the interpreter choose
as they would from the full lists, and each compile the audit does not need (1-3 s on a
2-core CPU, one per configuration, weight, dtype, head dim, causal and padding, per Triton)
is gone: 960 family configurations instead of 1606.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from elasticbench import launches
from elasticbench.attention.weights import Weight
from elasticbench.devices import triton_interpreted
from elasticbench.settings import settings


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
    ("dkdv", 128): (Tiles(128, 16, 8, 2),),
    ("dq", 64): (Tiles(128, 64, 8, 2), Tiles(128, 32, 4, 3), Tiles(64, 64, 4, 3),
                 Tiles(128, 64, 8, 3)),
    ("dq", 128): (Tiles(128, 64, 8, 2), Tiles(128, 32, 8, 3), Tiles(64, 64, 4, 2),
                  Tiles(128, 32, 8, 2), Tiles(64, 32, 4, 3)),
}
_NOT_CAUSAL = {("fwd", 64, Tiles(128, 64, 4, 3)), ("dq", 64, Tiles(128, 32, 4, 3))}
# Triton 3.6.0 (the GPU machines' Triton; `elasticbench audit --attention` with it first on
# the path, docs/attention.md section 7): dk/dv 64x32 w4 s3 at head dim 128 spilled 32-64 B
# per thread in every case, dk/dv 128x32 w8 s2 at 128 8-16 B (3.9.0 8-32) and 128x32 w8 s3
# at 128 causal 8 B (3.9.0: fp16 not causal 24): the dk/dv list at 128 is 128x16 w8 s2
# alone, the one tile found that spills with neither Triton, causal or not, key padding or
# not; dq 128x32 w4 s3 at 64 causal 24 B (causal off, above); every TMA dk/dv at 128
# 16-136 B (the TMA list at 128 is empty)
# (kernel, head-dim class, causal, weight, tiles) that spill for that weight alone (the
# compile audit, per weight, bytes per thread): the 4-warp 128x64 forward at 64, already at
# 252 registers for Elastic (24 for sigmoid, stablemax in bf16, 8 for symax in fp16, 16 for
# cog in bf16 with Triton 3.6.0); with Triton 3.6.0, softmax1's dq 64x64 w4 s2 at 128 (8,
# fp16 with key padding; off causal or not)
_SPILLS_FOR = {("fwd", 64, False, w, Tiles(128, 64, 4, 3))
               for w in (Weight.SYMAX, Weight.STABLEMAX, Weight.SIGMOID, Weight.COG)} | {
    ("dq", 128, causal, Weight.SOFTMAX1, Tiles(64, 64, 4, 2)) for causal in (False, True)}
# (kernel, head-dim class, causal, tiles) that spill only with a key-padding mask (its flags
# hold more live values): none since the dk/dv list at 128 lost its 128x32 tiles (their
# spills with padding: 8-24 B per thread)
_PADDED_SPILLS: set[tuple[str, int, bool, Tiles]] = set()
# head dims above 128: one small tile, not tuned (audited neither)
_HALF_WIDE: dict[str, tuple[Tiles, ...]] = {
    "fwd": (Tiles(64, 32, 4, 2),), "dkdv": (Tiles(64, 32, 4, 2),), "dq": (Tiles(64, 32, 4, 2),)}
# fp32: 32 x 32 spills in dk/dv and dq at head dim 128 (their IEEE products keep fp32 tiles of
# 32 x 128 live), on 4 warps and on 8; dk/dv 32x16 w8 s2 at 64 causal with key padding
# spilled 24 B per thread with Triton 3.6.0, 32x16 w8 s3 on neither Triton in any case
_FP32: dict[str, tuple[Tiles, ...]] = {
    "fwd": (Tiles(32, 32, 4, 3),), "dkdv": (Tiles(32, 16, 8, 3),), "dq": (Tiles(32, 16, 4, 2),)}
# per head-dim class where the one above spills: dq 32x16 w4 s2 at 64 causal with key padding
# spilled 8 B per thread with Triton 3.6.0; 32x16 w8 s2 spills at 64 on neither Triton (at
# 128 it does with 3.6.0, 16 B), and no candidate tried held at both head dims on both
_FP32_AT: dict[tuple[str, int], tuple[Tiles, ...]] = {("dq", 64): (Tiles(32, 16, 8, 2),)}
# fp32 forward for the family's other weights, per head-dim class: Elastic's 32x32 w4 s3
# spilled with Triton 3.6.0 (the compile audit of commit 3565197, bytes per thread) for symax
# at head dim 128 (416-656, causal or not, key padding or not) and for stablemax at 64 (16, key
# padding, not causal). Their IEEE divisions call ptxas's slow-path routine, and where a
# register is saved across that call the kernel has an 8-16 B stack frame, which the driver
# reports as local memory like a spill: at 64, 32x16 w8 s3 (8, symax and stablemax) and 32x32
# w8 s3 (8-16, symax, stablemax and softmax1) had one in some causal or padding case, 32x16 w4
# s3 in none (80-119 registers, the four weights, causal or not, key padding or not); at 128,
# 32x16 w8 s3 had none (78-80 registers; 32x32 w8 s3: 24 for symax)
_FP32_FAMILY: dict[tuple[str, int], tuple[Tiles, ...]] = {
    ("fwd", 64): (Tiles(32, 16, 4, 3),), ("fwd", 128): (Tiles(32, 16, 8, 3),)}
# and for one weight: sigmoid's forward at 128, where 32x16 w8 s3 had a 16 B frame with Triton
# 3.6.0 (causal with key padding), 32x32 w4 s3 spilled 408-648 B and 32x16 w4 s3 88-232;
# 32x16 w8 s2 had none (76-79 registers, every causal and padding case); cog's dq at 64, where
# 32x16 w8 s2 spilled 8 B with Triton 3.6.0 (causal with key padding) and 32x16 w8 s3 had
# none with either Triton (70-76 registers, every causal and padding case). With Triton 3.9.0
# (the fp32 audit of commit 5324c27): stablemax's forward at 128 (32x16 w8 s3: 8 B, causal
# with key padding and a gate) takes sigmoid's 32x16 w8 s2 (71-87 registers, both Tritons);
# stablemax's dq at 64 (32x16 w8 s2: 8 B with key padding; w8 s3: 8 B there too) 32x16 w4 s3
# (78-80); sigmoid's dk/dv at 64 (32x16 w8 s3: 24 B, causal with key padding; w8 s2 spills
# 8-24 B with Triton 3.6.0, w4 s3 8 B with 3.9.0) 32x16 w4 s2 (107-250 registers, none
# spilled with either Triton, every causal and padding case)
_FP32_FOR: dict[tuple[str, int, Weight], tuple[Tiles, ...]] = {
    ("fwd", 128, Weight.SIGMOID): (Tiles(32, 16, 8, 2),),
    ("fwd", 128, Weight.STABLEMAX): (Tiles(32, 16, 8, 2),),
    ("dq", 64, Weight.COG): (Tiles(32, 16, 8, 3),),
    ("dq", 64, Weight.STABLEMAX): (Tiles(32, 16, 4, 3),),
    ("dkdv", 64, Weight.SIGMOID): (Tiles(32, 16, 4, 2),)}


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
    ("dkdv", 128): (),
    ("dq", 64): (Tiles(128, 64, 8, 2), Tiles(64, 64, 4, 3), Tiles(128, 64, 8, 3)),
    ("dq", 128): (Tiles(128, 64, 8, 2), Tiles(128, 32, 8, 3), Tiles(64, 64, 4, 2),
                  Tiles(128, 32, 8, 2), Tiles(64, 32, 4, 3)),
}
# (kernel, head-dim class, dtype, causal, tiles) whose TMA form spills for one dtype alone:
# dq 64x64 w4 s2 at 128, fp16 causal with key padding, 8 B per thread with Triton 3.6.0 (the
# compile audit of commit 44e404e; off causal with padding or not)
_TMA_SPILLS: set[tuple[str, int, torch.dtype, bool, Tiles]] = {
    ("dq", 128, torch.float16, True, Tiles(64, 64, 4, 2))}
TMA_ENV = "ELASTICBENCH_TRITON_ATTENTION_TMA"


def tma_available() -> bool:
    """Whether the installed Triton has device-side tensor descriptors and the allocator
    their global scratch needs (found by feature, not by version)."""
    import triton
    import triton.language as tl

    return hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")


def tma_mode() -> str | None:
    """$ELASTICBENCH_TRITON_ATTENTION_TMA (read once, elasticbench.settings): "1" TMA only,
    where the call allows it, "0" none; unset or empty, both kinds listed (the tuner picks)."""
    return settings().triton_attention_tma


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
    if tma and not tma_available():
        return ()
    return _listed(kernel, head_dim_class(head_dim), dtype, causal, Weight(weight), tma,
                   padded)


def _listed(kernel: str, cls: int, dtype: torch.dtype, causal: bool, w: Weight, tma: bool,
            padded: bool) -> tuple[Tiles, ...]:
    """`configs` for a head-dim class, whatever this Triton has."""
    if tma:
        if dtype == torch.float32:
            return ()
        listed = tuple(Tiles(t.block_m, t.block_n, t.warps, t.stages, True)
                       for t in _TMA_HALF.get((kernel, cls), ())
                       if (kernel, cls, dtype, bool(causal), t) not in _TMA_SPILLS)
    elif dtype == torch.float32:
        if (kernel, cls, w) in _FP32_FOR:
            return _FP32_FOR[(kernel, cls, w)]
        if w != Weight.ELASTIC and (kernel, cls) in _FP32_FAMILY:
            return _FP32_FAMILY[(kernel, cls)]
        return _FP32_AT.get((kernel, cls), _FP32[kernel])
    else:
        listed = _HALF.get((kernel, cls), _HALF_WIDE[kernel])
    kept = tuple(t for t in listed if not (causal and (kernel, cls, t) in _NOT_CAUSAL)
                 and (kernel, cls, bool(causal), w, t) not in _SPILLS_FOR
                 and not (padded and (kernel, cls, bool(causal), t) in _PADDED_SPILLS))
    return kept if w == Weight.ELASTIC else _family_trim(kept)


def _family_trim(kept: tuple[Tiles, ...]) -> tuple[Tiles, ...]:
    """A family weight's list (every weight but Elastic; see the module docstring): of what
    Elastic's list leaves it, the rule's configuration (the first) and the smallest (the
    interpreter's, and the one that fits where a larger one does not), in list order."""
    if len(kept) <= 2:
        return kept
    keep = {kept[0], smallest(kept)}
    return tuple(t for t in kept if t in keep)


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


def rule(options: tuple[Tiles, ...]) -> Tiles:
    """The configuration of a key no table names: the first offered, which is the first of
    its pointer list (the one expected to win on an H100; TMA only where
    $ELASTICBENCH_TRITON_ATTENTION_TMA=1 offers nothing else: TMA has never run on a GPU)."""
    return options[0]


_TILES_TEXT = re.compile(r"(\d+)x(\d+) w(\d+) s(\d+)( tma)?")


def parse_tiles(text: str) -> Tiles:
    """A configuration from its text (`str(Tiles)`: "128x64 w8 s3", "... tma")."""
    found = _TILES_TEXT.fullmatch(text.strip()) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"{text!r} is not a configuration (write it as '128x64 w8 s3', "
                         "optionally followed by ' tma')")
    bm, bn, w, s = (int(x) for x in found.groups()[:4])
    return Tiles(bm, bn, w, s, found.group(5) is not None)


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def length_class(length: int) -> int:
    """The length class of a call whose longer side (max(lq, lk)) is `length`: the smallest
    power of 4 at least `length`, from 64 (64, 256, 1024, 4096, 16384, ...)."""
    n = 64
    while n < length:
        n *= 4
    return n


@dataclass(frozen=True)
class Gpu:
    """A GPU as a table names it: compute capability and the device name torch reports
    (name "*": every GPU of that capability)."""

    capability: tuple[int, int]
    name: str


@dataclass(frozen=True)
class Key:
    """What a table entry is keyed by: the GPU, kernel ("fwd", "dkdv", "dq"), dtype name
    ("bf16", "fp16", "fp32"), head-dim class (`head_dim_class`), causal, key padding, the
    weight's lower-case name and the length class (`length_class`)."""

    gpu: Gpu
    kernel: str
    dtype: str
    head_dim: int
    causal: bool
    padded: bool
    weight: str
    length: int

    def __str__(self) -> str:
        flags = [self.dtype, f"d{self.head_dim}", self.weight, f"L<={self.length}"] + \
            (["causal"] if self.causal else []) + (["padded"] if self.padded else [])
        return f"{self.kernel} {' '.join(flags)}"


TABLE_FORMAT = "elasticbench-attention-table"
TABLE_VERSION = 1
TABLE_ENV = "ELASTICBENCH_ATTENTION_TABLE"
TUNE_ENV = "ELASTICBENCH_ATTENTION_TUNE"
PACKAGED_TABLES = Path(__file__).with_name("tables")


class TableError(ValueError):
    """A configuration table that cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class Table:
    """A loaded table: its file, its entries, and whether its timings came from Triton's
    interpreter (plumbing only: never a GPU table)."""

    path: str
    entries: dict[Key, Tiles]
    interpreter: bool = False


def _offered_anywhere(key: Key, tiles: Tiles) -> bool:
    """Whether `tiles` is on the key's pointer or TMA list (whatever this Triton has): what
    `elasticbench audit --attention` compiles, so all a table may name."""
    return tiles in _listed(key.kernel, key.head_dim, DTYPES[key.dtype], key.causal,
                            Weight[key.weight.upper()], tiles.tma, key.padded)


def _entry(raw: Any) -> tuple[Key, Tiles]:
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    need = {"gpu": str, "capability": list, "kernel": str, "dtype": str, "head_dim": int,
            "causal": bool, "padded": bool, "weight": str, "length": int, "tiles": str}
    for name, kind in need.items():
        if not isinstance(raw.get(name), kind) or (kind is int and isinstance(raw[name], bool)):
            raise ValueError(f"{name!r} missing or not a {kind.__name__}")
    cap = raw["capability"]
    if len(cap) != 2 or not all(isinstance(c, int) and not isinstance(c, bool) for c in cap):
        raise ValueError("'capability' must be [major, minor]")
    if raw["kernel"] not in KERNELS:
        raise ValueError(f"kernel {raw['kernel']!r} is not one of {', '.join(KERNELS)}")
    if raw["dtype"] not in DTYPES:
        raise ValueError(f"dtype {raw['dtype']!r} is not one of {', '.join(DTYPES)}")
    if raw["head_dim"] != head_dim_class(raw["head_dim"]):
        raise ValueError(f"head_dim {raw['head_dim']} is not a head-dim class (64, 128, ...)")
    if raw["length"] != length_class(raw["length"]):
        raise ValueError(f"length {raw['length']} is not a length class (64 times a power "
                         "of 4)")
    names = [w.name.lower() for w in Weight]
    if raw["weight"] not in names:
        raise ValueError(f"weight {raw['weight']!r} is not one of {', '.join(names)}")
    key = Key(Gpu((cap[0], cap[1]), raw["gpu"]), raw["kernel"], raw["dtype"],
              raw["head_dim"], raw["causal"], raw["padded"], raw["weight"], raw["length"])
    tiles = parse_tiles(raw["tiles"])
    if not _offered_anywhere(key, tiles):
        raise ValueError(f"{tiles} is not an offered configuration for {key} (only those "
                         "`elasticbench audit --attention` compiles may be named)")
    return key, tiles


def load_table(path: str | os.PathLike) -> Table:
    """The table in a JSON file (docs/attention.md section 7: {"format": TABLE_FORMAT,
    "version": 1, "interpreter": bool, "entries": [{"gpu", "capability", "kernel", "dtype",
    "head_dim", "causal", "padded", "weight", "length", "tiles"}, ...]}, other fields
    informational). Raises TableError naming the file on anything unusable."""
    where = f"attention configuration table {os.fspath(path)}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise TableError(f"{where}: cannot be read ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TableError(f"{where}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
        raise TableError(f"{where}: not an attention table (no \"format\": \"{TABLE_FORMAT}\")")
    if data.get("version") != TABLE_VERSION:
        raise TableError(f"{where}: version {data.get('version')!r}; this elasticbench reads "
                         f"version {TABLE_VERSION}")
    raw_entries = data.get("entries")
    if not isinstance(raw_entries, list):
        raise TableError(f"{where}: \"entries\" must be a list")
    entries: dict[Key, Tiles] = {}
    for i, raw in enumerate(raw_entries):
        try:
            key, tiles = _entry(raw)
        except ValueError as e:
            raise TableError(f"{where}: entry {i}: {e}") from None
        if key in entries:
            raise TableError(f"{where}: entry {i}: a second entry for {key}")
        entries[key] = tiles
    return Table(os.fspath(path), entries, bool(data.get("interpreter", False)))


def entry_record(key: Key, tiles: Tiles, **extra: Any) -> dict:
    """A table entry as `load_table` reads it (extra: informational fields, e.g. timings)."""
    return {"gpu": key.gpu.name, "capability": list(key.gpu.capability),
            "kernel": key.kernel, "dtype": key.dtype, "head_dim": key.head_dim,
            "causal": key.causal, "padded": key.padded, "weight": key.weight,
            "length": key.length, "tiles": str(tiles), **extra}


def _packaged() -> list[Table]:
    out = []
    for path in sorted(PACKAGED_TABLES.glob("*.json")):
        table = load_table(path)
        if table.interpreter:
            raise TableError(f"attention configuration table {path}: interpreter timings "
                             "are never a GPU table")
        out.append(table)
    return out


_TABLES: tuple[Table, ...] | None = None
_LOCK = threading.RLock()


def tables() -> tuple[Table, ...]:
    """The tables a choice consults, first match wins: the file named by
    $ELASTICBENCH_ATTENTION_TABLE (read once, elasticbench.settings) and then the package's, by
    name.
    Raises TableError (naming the file) on a bad one."""
    global _TABLES
    if _TABLES is None:
        with _LOCK:
            if _TABLES is None:
                user = settings().attention_table
                if user is not None:
                    try:
                        first = [load_table(user)]
                    except TableError as e:
                        raise TableError(f"{TABLE_ENV}: {e}") from None
                else:
                    first = []
                _TABLES = tuple(first + _packaged())
    return _TABLES


def tuning_enabled() -> bool:
    """$ELASTICBENCH_ATTENTION_TUNE=1: time the offered configurations on the first call of
    a key no table names (read once); unset, empty or 0: never."""
    return settings().attention_tune


def reset() -> None:
    """Forget the tables and every choice made (tests; `elasticbench tune` between its
    keys): the next call loads the tables again, the file the process's settings name
    (`elasticbench.settings.refresh()` reads the environment again)."""
    global _TABLES
    with _LOCK:
        _TABLES = None
        _CHOSEN.clear()
        _GPUS.clear()


def lookup(key: Key) -> Tiles | None:
    """The configuration the tables name for `key` (its GPU by name, then any of its
    capability under the name "*"), or None."""
    anyname = replace(key, gpu=Gpu(key.gpu.capability, "*"))
    for table in tables():
        found = table.entries.get(key) or table.entries.get(anyname)
        if found is not None:
            return found
    return None


def decide(key: Key, options: tuple[Tiles, ...]) -> Tiles:
    """The configuration for `key` among the call's `options` (`offered`), without timing:
    the tables' where it is offered (its tiles in pointer form where the call cannot use
    TMA), else `rule(options)`. Pure: the same key and options give the same answer."""
    found = lookup(key)
    if found is not None:
        if found in options:
            return found
        if found.tma and replace(found, tma=False) in options:
            return replace(found, tma=False)
    return rule(options)


_FIT_ERRORS: tuple[type[BaseException], ...] | None = None


def _fit_errors() -> tuple[type[BaseException], ...]:
    """Triton's "out of resources" classes, wherever this Triton defines them."""
    global _FIT_ERRORS
    if _FIT_ERRORS is None:
        import importlib

        found: list[type[BaseException]] = []
        for module in ("triton.runtime.errors", "triton.runtime.autotuner",
                       "triton.compiler.errors"):
            try:
                cls = getattr(importlib.import_module(module), "OutOfResources", None)
            except ImportError:
                continue
            if isinstance(cls, type) and cls not in found:
                found.append(cls)
        _FIT_ERRORS = tuple(found)
    return _FIT_ERRORS


def does_not_fit(error: BaseException) -> bool:
    """Whether a launch's error means only "this configuration does not fit this GPU":
    Triton's OutOfResources (shared memory, threads), ptxas refusing a kernel for its
    resources ("uses too much shared data"), or the driver's "too many resources requested
    for launch". Anything else (out of memory, a device fault, a grid too large, a compile
    error) is not, and reaches the caller."""
    if isinstance(error, _fit_errors()):
        return True
    text = str(error)
    if type(error).__name__ == "PTXASError":
        return "too much" in text or "out of resource" in text.lower()
    return isinstance(error, RuntimeError) and "too many resources requested for launch" in text


def tune(options: tuple[Tiles, ...], time_one: Callable[[Tiles], float],
         what: str = "attention") -> tuple[Tiles, dict[Tiles, float]]:
    """(fastest, timings in ms) of `options` by `time_one`; one that does not fit
    (`does_not_fit`) times inf, any other error propagates; ties go to the earlier option.
    Raises RuntimeError when none fits."""
    timings: dict[Tiles, float] = {}
    for t in options:
        try:
            timings[t] = float(time_one(t))
        except Exception as e:
            if not does_not_fit(e):
                raise
            timings[t] = math.inf
    best = min(options, key=lambda t: (timings[t], options.index(t)))
    if math.isinf(timings[best]):
        raise RuntimeError(f"no {what} configuration fits this GPU (all "
                           f"{len(options)} out of resources)")
    return best, timings


_GPUS: dict[int, Gpu] = {}


def gpu_of(device: torch.device) -> Gpu:
    """The GPU of a CUDA device (capability and name), looked up once per device index."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    gpu = _GPUS.get(index)
    if gpu is None:
        major, minor = torch.cuda.get_device_capability(index)
        gpu = Gpu((int(major), int(minor)), torch.cuda.get_device_name(index))
        _GPUS[index] = gpu
    return gpu


_CHOSEN: dict[tuple, Tiles] = {}


def _gpu_for(q: torch.Tensor) -> Gpu | None:
    """q's GPU; None under the interpreter and for CPU tensors (the smallest configuration)."""
    return gpu_of(q.device) if q.is_cuda and not triton_interpreted() else None


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False where torch has no CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def choose(kernel: str, head_dim: int, q: torch.Tensor, causal: bool, has_mask: bool,
           time_one: Callable[[Tiles], float] | None = None, weight: Weight = Weight.ELASTIC,
           tma: bool = False, length: int = 0, gpu: Gpu | None = None) -> Tiles:
    """The configuration for this call among `offered(...)` (tma: the call may use tensor
    descriptors; length: max(lq, lk)): under the interpreter or with CPU tensors the
    smallest; on a GPU (q's, or `gpu` as if on it) `decide` by the key's table entry or the
    rule, remembered per key: no timing, no synchronization, no allocation. Only with
    $ELASTICBENCH_ATTENTION_TUNE=1, a key no table names, and the stream not capturing a
    CUDA graph, the offered configurations are timed by `time_one(tiles)` (ms) once and the
    fastest kept (`tune`)."""
    tiles = _choose(kernel, head_dim, q, causal, has_mask, time_one, weight, tma, length, gpu)
    launches.note(lambda: f"{kernel} {tiles}")
    return tiles


def _choose(kernel: str, head_dim: int, q: torch.Tensor, causal: bool, has_mask: bool,
            time_one: Callable[[Tiles], float] | None, weight: Weight, tma: bool, length: int,
            gpu: Gpu | None) -> Tiles:
    if gpu is None:
        gpu = _gpu_for(q)
    cls = head_dim_class(head_dim)
    cache_key = (gpu, kernel, cls, q.dtype, bool(causal), bool(has_mask), int(weight),
                 bool(tma), tma_mode(), length_class(length))
    hit = _CHOSEN.get(cache_key)
    if hit is not None:
        return hit
    options = offered(kernel, head_dim, q.dtype, causal, weight, tma, has_mask)
    if gpu is None:
        chosen = smallest(options)
    else:
        key = Key(gpu, kernel, _DTYPE_NAMES.get(q.dtype, str(q.dtype)), cls, bool(causal),
                  bool(has_mask), Weight(weight).name.lower(), length_class(length))
        with _LOCK:
            if cache_key in _CHOSEN:
                return _CHOSEN[cache_key]
            named = lookup(key)
            if named is None and time_one is not None and len(options) > 1 and \
                    tuning_enabled():
                if _capturing():
                    return rule(options)  # not kept: timed at the first call outside
                chosen = tune(options, time_one, f"{kernel} attention")[0]
            else:
                chosen = decide(key, options)
    _CHOSEN[cache_key] = chosen
    return chosen


def chosen() -> dict[tuple, Tiles]:
    """The choices made so far in this process (for the sweep and reports)."""
    return dict(_CHOSEN)
