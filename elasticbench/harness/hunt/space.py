"""The hunt's search space: one configuration is a shape, a layout, parameters and a recipe
for the values; it is drawn at random or changed a little from a good one.

Shapes lean toward where kernels switch paths: column counts near a power of two up to
2^22, row counts past 256 to 65536 (launch limits, row blocks). A configuration costs about
its element count (making, handing over, calling and scoring it), so one of more than SMALL
elements is kept with probability SMALL/elements and drawn again otherwise: each doubling of
size past SMALL then gets about the same share of the search's time rather than the same
share of its draws, which let the largest few take most of the time. A long row is a path
of its own (sums over many blocks), so a configuration of at most FEW rows is kept LONG
times as often. Parameters are drawn
log-uniformly over their span. Values come from a mix of the adversarial generators, one
per row in turn, sometimes sorted, with a few extreme values ("spikes") set at random
places. A long row in fp32 or fp64 draws from a palette of a few thousand of its
generator's values, so that the exact reference (which costs per distinct value) stays
cheap at any length; each stretch of the row draws from its own part of the palette, so
that the blocks of a long row differ (their maxima above all).
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass, replace

import numpy as np

from elasticbench.harness.functions import get_function
from elasticbench.harness.inputs.generators import GENERATOR_NAMES, generate
from elasticbench.harness.inputs.layouts import PACKED
from elasticbench.harness.numerics.dtypes import get_format

MAX_N = 1 << 22
MAX_ELEMENTS = 1 << 23  # rows x n of one configuration at most
SMALL = 1 << 17  # a configuration of more elements is kept with probability SMALL/elements
FEW, LONG = 4, 4  # ... or LONG * SMALL/elements when it has at most FEW rows
PALETTE_FROM = 4096  # fp32/fp64 rows longer than this draw from a palette
MAX_PALETTE = 2048
COUNT_SORT_FROM = 1 << 14  # 16-bit rows this long are sorted by counting, not by a sort
SPIKES = ("nan", "inf", "-inf", "zero", "-zero", "max", "-max", "ln_max", "tiny", "-tiny",
          "one", "minus_one")


@dataclass(frozen=True)
class Config:
    """One point of the search space; make_input turns it into an array, reproducibly."""

    function: str
    dtype: str
    rows: int
    n: int
    layout: str
    params: tuple[tuple[str, float], ...]
    generators: tuple[str, ...]  # row i draws from generators[i % len]
    palette: int | None  # distinct values a row draws from; None: independent draws
    spikes: tuple[tuple[int, int, str], ...]  # (row, column, kind), taken modulo the shape
    seed: int
    order: str | None = None  # rows sorted "ascending" or "descending": blocks of a row differ

    @property
    def elements(self) -> int:
        return self.rows * self.n

    def label(self) -> str:
        """The input's name in records: the generators, '~P' for a palette, '!' for spikes."""
        name = "+".join(self.generators)
        name += f"~{self.palette}" if self.palette else ""
        name += {"ascending": "/", "descending": "\\"}.get(self.order or "", "")
        return name + ("!" + ",".join(k for _, _, k in self.spikes) if self.spikes else "")


def spike_value(kind: str, dtype: str) -> float:
    fmt = get_format(dtype)
    return {
        "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "zero": 0.0, "-zero": -0.0,
        "max": fmt.max, "-max": -fmt.max, "ln_max": fmt.round_down(fmt.ln_max),
        "tiny": fmt.min_ulp, "-tiny": -fmt.min_ulp, "one": 1.0, "minus_one": -1.0,
    }[kind]


def make_input(c: Config) -> np.ndarray:
    """The configuration's input array in its format."""
    fmt = get_format(c.dtype)
    x = np.empty((c.rows, c.n), dtype=fmt.numpy)
    width = c.palette or c.n
    for i, name in enumerate(c.generators):
        rows = np.arange(i, c.rows, len(c.generators))
        if rows.size == 0:
            continue
        seed = c.seed * 31 + zlib.crc32(name.encode())
        values = generate(name, c.dtype, (rows.size, width), seed)
        if c.palette:  # each stretch of a row from its own part of the palette
            window = max(1, width // 4)
            pick = np.random.default_rng([seed, 1]).integers(0, window, (rows.size, c.n),
                                                              dtype=np.int32)
            pick += (np.arange(c.n) * width // c.n).astype(np.int32)
            pick[pick >= width] -= width  # both terms below width: the modulo, cheaply
            values = (np.take_along_axis(values, pick, axis=1) if not c.order
                      else sorted_picks(values, pick))
        elif c.order:
            values = sorted_rows(values)
        x[rows] = values if c.order != "descending" else values[:, ::-1]
    for r, col, kind in c.spikes:
        x[r % c.rows, col % c.n] = fmt.cast(np.array([spike_value(kind, c.dtype)]))[0]
    return x


def sorted_rows(values: np.ndarray) -> np.ndarray:
    """Each row sorted ascending, NaN last, as np.sort sorts it (but for the order of +0 and
    -0 among themselves); a long 16-bit row by counting its bit patterns, a short one through
    float32, which holds it exactly and which NumPy sorts several times faster than
    ml_dtypes' bfloat16."""
    if values.dtype.itemsize == 2 and values.shape[1] >= COUNT_SORT_FROM:
        patterns = _ascending_patterns(values.dtype)
        out = np.empty_like(values)
        for i, row in enumerate(values.view(np.uint16)):
            counts = np.bincount(row, minlength=1 << 16)[patterns]
            out[i] = np.repeat(patterns, counts).view(values.dtype)
        return out
    if values.dtype.itemsize < 4:
        return np.sort(values.astype(np.float32), axis=1).astype(values.dtype)
    return np.sort(values, axis=1)


@functools.cache
def _ascending_patterns(dtype: np.dtype) -> np.ndarray:
    """The 65536 bit patterns of a 16-bit format in ascending order of value, NaNs last."""
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    as32 = patterns.view(dtype).astype(np.float32)
    order = np.lexsort((~np.signbit(as32), as32, np.isnan(as32)))  # NaN last, -0 before +0
    return patterns[order]


def sorted_picks(palette: np.ndarray, pick: np.ndarray) -> np.ndarray:
    """Each row of palette[pick] (taken along rows) sorted ascending: the palette's row
    sorted, each value repeated as often as it is picked (a counting sort over at most
    MAX_PALETTE values instead of a sort of the whole row)."""
    order = np.argsort(palette, axis=1, kind="stable")
    out = np.empty(pick.shape, dtype=palette.dtype)
    for i in range(pick.shape[0]):
        rank = np.empty(order.shape[1], dtype=np.int64)
        rank[order[i]] = np.arange(order.shape[1])
        counts = np.bincount(rank[pick[i]], minlength=order.shape[1])
        out[i] = np.repeat(palette[i, order[i]], counts)
    return out


def _near_power_of_two(rng: np.random.Generator, lo: int, hi: int) -> int:
    k = int(rng.integers(lo, hi + 1))
    return max(1, (1 << k) + int(rng.choice([-1, 0, 1, 1, int(rng.integers(-9, 10))])))


def _log_uniform_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw_n(rng: np.random.Generator, max_n: int = MAX_N) -> int:
    if rng.random() < 0.5:
        return min(max_n, _near_power_of_two(rng, 0, max_n.bit_length() - 1))
    return _log_uniform_int(rng, 1, max_n)


def draw_rows(rng: np.random.Generator) -> int:
    if rng.random() < 0.3:
        return _near_power_of_two(rng, 8, 16)
    return _log_uniform_int(rng, 1, 64)


def draw_param(name: str, function: str, rng: np.random.Generator) -> float:
    p = next(q for q in get_function(function).params if q.name == name)
    u = rng.random()
    if u < 0.1:
        return float(rng.choice(p.grid))
    lo, hi = p.span
    return p.validate(float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.4g}"))


def _palette(dtype: str, n: int, rng: np.random.Generator) -> int | None:
    if dtype in ("fp32", "fp64") and n > PALETTE_FROM:
        return _log_uniform_int(rng, 1, MAX_PALETTE)
    if rng.random() < 0.15:
        return _log_uniform_int(rng, 1, 64)
    return None


def _order(rng: np.random.Generator) -> str | None:
    u = rng.random()
    return "ascending" if u < 0.15 else "descending" if u < 0.3 else None


def _spikes(rng: np.random.Generator, k: int) -> tuple[tuple[int, int, str], ...]:
    return tuple((int(rng.integers(1 << 30)), int(rng.integers(1 << 30)), str(rng.choice(SPIKES)))
                 for _ in range(k))


def fit(c: Config, max_elements: int = MAX_ELEMENTS) -> Config:
    """c with rows cut so that it has at most max_elements elements, and a palette where a
    long fp32/fp64 row needs one."""
    rows = max(1, min(c.rows, max_elements // c.n))
    palette = c.palette
    if c.dtype in ("fp32", "fp64") and c.n > PALETTE_FROM and not palette:
        palette = MAX_PALETTE
    return replace(c, rows=rows, palette=palette)


def kept(c: Config, rng: np.random.Generator) -> bool:
    """Whether a configuration's size is kept: always up to SMALL elements, with probability
    SMALL/elements beyond (LONG times that for at most FEW rows). It is asked after fit has
    cut the rows: a long row drawn with many rows is kept as the few rows that fit."""
    return rng.random() * c.elements < SMALL * (LONG if c.rows <= FEW else 1)


class Space:
    """The configurations of one kernel: its function, the dtypes and layouts it takes."""

    def __init__(self, function: str, dtypes: list[str], layouts: list[str],
                 max_elements: int = MAX_ELEMENTS):
        self.function, self.dtypes, self.layouts = function, dtypes, layouts
        self.max_elements = max_elements
        self.max_n = min(MAX_N, max_elements)
        self.param_names = get_function(function).param_names

    def random(self, rng: np.random.Generator) -> Config:
        """A fresh configuration, drawn again until its size is kept (see kept)."""
        while True:
            c = fit(self._draw(rng), self.max_elements)
            if kept(c, rng):
                return c

    def mutate(self, c: Config, rng: np.random.Generator) -> Config | None:
        """c changed in one or two of its aspects; None when the change's size is not kept
        (the caller draws afresh instead)."""
        for _ in range(1 + int(rng.random() < 0.3)):
            c = self._change(c, rng)
        c = fit(c, self.max_elements)
        return c if kept(c, rng) else None

    def _draw(self, rng: np.random.Generator) -> Config:
        dtype = str(rng.choice(self.dtypes))
        n = draw_n(rng, self.max_n)
        others = [lay for lay in self.layouts if lay != PACKED]
        layout = str(rng.choice(others)) if others and rng.random() < 0.4 else PACKED
        k = 1 + int(rng.random() < 0.4) + int(rng.random() < 0.2)
        gens = tuple(str(g) for g in rng.choice(GENERATOR_NAMES, size=k, replace=False))
        spikes = _spikes(rng, int(rng.integers(1, 4))) if rng.random() < 0.25 else ()
        params = tuple((p, draw_param(p, self.function, rng)) for p in self.param_names)
        return Config(self.function, dtype, draw_rows(rng), n, layout, params, gens,
                      _palette(dtype, n, rng), spikes, int(rng.integers(1 << 31)), _order(rng))

    def _change(self, c: Config, rng: np.random.Generator) -> Config:
        what = str(rng.choice(["n", "rows", "params", "values", "seed", "layout", "dtype",
                               "spikes", "order"]))
        if what == "n":
            n = int(rng.choice([c.n * 2, c.n // 2, c.n + 1, c.n - 1, draw_n(rng, self.max_n),
                                1 << max(0, c.n.bit_length() - 1), (1 << c.n.bit_length()) + 1]))
            n = min(self.max_n, max(1, n))
            return replace(c, n=n, palette=_palette(c.dtype, n, rng))
        if what == "rows":
            rows = int(rng.choice([c.rows * 2, c.rows // 2, c.rows + 1, draw_rows(rng)]))
            return replace(c, rows=max(1, rows))
        if what == "params" and c.params:
            name = str(rng.choice(self.param_names))
            old = dict(c.params)[name]
            p = next(q for q in get_function(self.function).params if q.name == name)
            moved = old * math.exp(rng.normal(0, 1)) if old > 0 else 0.0
            new = (draw_param(name, self.function, rng) if rng.random() < 0.3
                   else p.validate(float(f"{moved:.4g}")) if moved > p.lower else old)
            return replace(c, params=tuple((k, new if k == name else v) for k, v in c.params))
        if what == "values":
            gens = list(c.generators)
            gens[int(rng.integers(len(gens)))] = str(rng.choice(GENERATOR_NAMES))
            if rng.random() < 0.3 and len(gens) < 3:
                gens.append(str(rng.choice(GENERATOR_NAMES)))
            return replace(c, generators=tuple(dict.fromkeys(gens)))
        if what == "layout":
            return replace(c, layout=str(rng.choice(self.layouts)))
        if what == "dtype":
            return replace(c, dtype=str(rng.choice(self.dtypes)))
        if what == "order":
            return replace(c, order=_order(rng))
        if what == "spikes":
            spikes = list(c.spikes)
            if spikes and rng.random() < 0.4:
                spikes.pop(int(rng.integers(len(spikes))))
            else:
                spikes += _spikes(rng, 1)
            return replace(c, spikes=tuple(spikes))
        return replace(c, seed=int(rng.integers(1 << 31)))
