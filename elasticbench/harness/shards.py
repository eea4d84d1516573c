"""Splitting a plan over machines: `--shard K/N` keeps one deterministic part of it.

The split is a pure function of the items' keys: every shard computes the whole plan, sorts
its distinct keys by a canonical string (never Python's salted hash()), and keeps the keys at
positions i with i % N == K - 1, with every item of those keys. Shards are therefore
disjoint and together complete, whatever order the plan was built in, and balanced to within
one key. Items that share a key stay together (a run keeps each cell's baseline with the
kernels timed against it). Each shard file records the fingerprint of the whole plan, so a
merge (gate/merge.py) can refuse shards of different plans.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 1 <= K <= N; ValueError says what is wrong."""
    m = _SHARD.match(str(text))
    if not m:
        raise ValueError(f"a shard is K/N, like 2/4; got {text!r}")
    k, n = int(m.group(1)), int(m.group(2))
    if not 1 <= k <= n:
        raise ValueError(f"a shard K/N needs 1 <= K <= N; got {k}/{n}")
    return k, n


def canonical(key: Any) -> str:
    """A stable text form of a key, equal across processes and machines."""
    return json.dumps(key, sort_keys=True, default=str, separators=(",", ":"))


def fingerprint(keys: Iterable[Any]) -> str:
    """Identity of a whole plan: a hash of its sorted canonical keys."""
    h = hashlib.sha256()
    for text in sorted(canonical(k) for k in keys):
        h.update(text.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def select_shard(items: list[T], k: int, n: int, key: Callable[[T], Any]) -> list[T]:
    """The items of shard k of n, in their original order."""
    if not 1 <= k <= n:
        raise ValueError(f"a shard K/N needs 1 <= K <= N; got {k}/{n}")
    texts = [canonical(key(it)) for it in items]
    mine = set(sorted(set(texts))[k - 1::n])
    return [it for it, text in zip(items, texts, strict=True) if text in mine]


def shard_header(k: int, n: int, all_keys: list[Any], mine: int) -> dict[str, Any]:
    """What a shard file says about itself, for merge to check."""
    return {"index": k, "count": n, "matrix": fingerprint(all_keys), "items": len(all_keys),
            "items_here": mine}
