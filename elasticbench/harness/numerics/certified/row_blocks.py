"""How the fast reference walks its rows: in blocks of BLOCK elements whose temporaries stay
in a core's L2, and, for long rows that repeat their values, once per distinct value.

A row of n logits with m distinct values has only m distinct outputs: the exponentials,
the outputs and their bounds depend on the value alone, and the row's sums are sums of m
terms, each a value's term times the number of times it occurs (one more rounding per
term, which the bounds count). The fast reference evaluates such a row as its m distinct values with
their counts and spreads the results back over the n positions (docs/numerics.md section
6.3); 16-bit rows longer than 65536 always repeat, and so do the coarse and palette inputs
of any format. Values are told apart by their bits, so that -0 and +0 stay apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields, replace
from typing import Any, TypeVar

import ml_dtypes
import numpy as np

from elasticbench.harness.numerics.certified import dd

BLOCK = 8192  # elements per block
FROM = 8192  # rows at least this long are looked at
SAMPLE = 2048  # values drawn across the row to judge whether it repeats
MOST = 0.75  # a sample with more than this share of distinct values: evaluate per element

R = TypeVar("R")


def blocks(shape: tuple[int, int]) -> Iterator[tuple[slice, slice, int]]:
    """(rows, columns, block index within the row) covering an (r, n) array, BLOCK elements
    at most: several short rows a block, or one long row in several blocks."""
    r, n = shape
    if n >= BLOCK:
        for i in range(r):
            for b, j in enumerate(range(0, n, BLOCK)):
                yield slice(i, i + 1), slice(j, min(n, j + BLOCK)), b
    else:
        per = max(1, BLOCK // max(n, 1))
        for i in range(0, r, per):
            yield slice(i, min(r, i + per)), slice(0, n), 0


def blocks_per_row(n: int) -> int:
    return max(1, -(-n // BLOCK)) if n >= BLOCK else 1


def sum_depth(n: int) -> int:
    """Tree levels between a term and a row sum made of block sums (see blocks)."""
    return dd.depth(min(n, BLOCK)) + dd.depth(blocks_per_row(n))


def distinct(row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A float64 row's distinct values (by bits, in the order of their bits), each position's
    index into them and each value's count; None where the row is short or repeats too
    little to gain."""
    n = row.size
    if n < FROM:
        return None
    bits = np.ascontiguousarray(row).view(np.uint64)
    sample = bits[:: n // SAMPLE][:SAMPLE]
    for fmt in SIXTEEN_BIT:  # at most 65536 values: counted whatever the sample says
        if _in_format(sample, fmt) is not None and (narrow := _narrow(bits, fmt)) is not None:
            return narrow if narrow[0].size <= MOST * n else None
    seen = np.unique(sample).size
    if seen > MOST * SAMPLE:
        return None
    grouped = _hashed(bits, seen) or _sorted(bits)
    return grouped if grouped is not None and grouped[0].size <= MOST * n else None


def _sorted(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    values = np.unique(bits)  # a sort, then a search: far faster than unique's argsort
    if values.size > MOST * bits.size:
        return None
    index = np.searchsorted(values, bits)
    return values.view(np.float64), index, np.bincount(index).astype(np.float64)


GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: multiplicative hashing
LOSERS = 0.25  # a hash that leaves more than this share of positions unplaced: sort instead


def _hashed(bits: np.ndarray, seen: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The grouping of distinct (however many values) in a few passes instead of a sort:
    each value hashed to one of 32x as many slots as the sample saw values; a value that
    lost its slot to another (a collision) is grouped with the other losers by a sort of
    those alone. None where too many lost (the sample saw few of the row's values): the
    caller sorts."""
    k = min(20, max(10, (32 * seen).bit_length()))
    slot = ((bits * GOLDEN) >> np.uint64(64 - k)).view(np.int64)
    table = np.zeros(1 << k, dtype=np.uint64)
    table[slot] = bits  # one value per slot: whichever was written last
    lost = table[slot] != bits
    losers = int(np.count_nonzero(lost))
    if losers > LOSERS * bits.size:
        return None
    owned = np.flatnonzero(np.bincount(slot[~lost] if losers else slot, minlength=1 << k))
    rest, rest_index = np.unique(bits[lost], return_inverse=True)
    values = np.concatenate([table[owned], rest])
    order = np.argsort(values)  # by bits, as np.unique orders them
    rank = np.empty(values.size, dtype=np.int64)
    rank[order] = np.arange(values.size)
    where = np.zeros(1 << k, dtype=np.int64)
    where[owned] = rank[: owned.size]
    index = where[slot]
    if losers:
        index[lost] = rank[owned.size + rest_index]
    return (values[order].view(np.float64), index,
            np.bincount(index, minlength=values.size).astype(np.float64))


SIXTEEN_BIT = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _in_format(bits: np.ndarray, fmt: np.dtype) -> np.ndarray | None:
    """float64 values (as their bits) in a 16-bit format, where each of them survives the
    round trip; else None."""
    with np.errstate(over="ignore", invalid="ignore"):  # a value out of its range: no match
        narrow = bits.view(np.float64).astype(fmt)
    return narrow if np.array_equal(narrow.astype(np.float64).view(np.uint64), bits) else None


def _narrow(bits: np.ndarray, fmt: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """distinct for a row whose every value is one of a 16-bit format's: counted over the
    65536 patterns instead of sorted, ten times faster on a long row, with the values in
    the same order (both are sign and magnitude)."""
    narrow = _in_format(bits, fmt)
    if narrow is None:
        return None
    key = narrow.view(np.uint16)
    counts = np.bincount(key, minlength=1 << 16)
    present = np.flatnonzero(counts)
    rank = np.zeros(1 << 16, dtype=np.intp)
    rank[present] = np.arange(present.size)
    values = present.astype(np.uint16).view(fmt).astype(np.float64)
    return values, rank[key], counts[present].astype(np.float64)


def by_distinct(evaluate: Callable[[np.ndarray, np.ndarray | None], R],
                x: np.ndarray) -> R | None:
    """evaluate(values, counts) on each row of x that repeats, evaluate(row, None) on the
    others, every result spread back over its row's positions and the rows stacked; None
    when no row of x repeats (the caller evaluates x as it is)."""
    if x.shape[1] < FROM:  # no row to look at (and rows may be many)
        return None
    plans = [distinct(row) for row in x]
    if all(p is None for p in plans):
        return None
    parts = []
    for row, plan in zip(x, plans, strict=True):
        if plan is None:
            parts.append(evaluate(row[None, :], None))
            continue
        values, index, counts = plan
        parts.append(spread(evaluate(values[None, :], counts[None, :]), index))
    return stack(parts)


def spread(result: Any, index: np.ndarray) -> Any:
    """A result (a record, a tuple of records, per-row arrays and None) of one row of
    distinct values, with every per-position field, (1, m), taken at index: (1, n)."""
    if isinstance(result, tuple):
        return tuple(spread(r, index) for r in result)
    if result is None or isinstance(result, np.ndarray):
        return result
    return replace(result, **{f.name: np.take(v, index, axis=1) for f in fields(result)
                              if isinstance(v := getattr(result, f.name), np.ndarray)
                              and v.ndim == 2})


def stack(parts: list[Any]) -> Any:
    """Results of single rows (records, or tuples of them) joined along the rows."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, tuple):
        return tuple(stack([p[i] for p in parts]) for i in range(len(first)))
    if first is None:
        return None
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    return replace(first, **{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                             for f in fields(first)
                             if isinstance(getattr(first, f.name), np.ndarray)})


def rows_of(record: Any, sl: slice) -> Any:
    """The same record for the rows sl: every array field cut along its first axis."""
    return replace(record, **{f.name: getattr(record, f.name)[sl] for f in fields(record)
                              if isinstance(getattr(record, f.name), np.ndarray)})
