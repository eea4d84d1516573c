"""Shrinking a failure to a small reproducer: fewest rows and columns, simplest values,
parameters rounded, a packed layout, each step kept only if the kernel still fails the
same way.

Greedy, in the spirit of delta debugging: rows and columns are cut by bisection on the
prefix that still fails (a kernel wrong past some row or column count keeps just past it),
then by powers of two (a failure that needs a residue of the count keeps it), then leading
ones are dropped; values are set, in shrinking blocks, to one fill value and
the rest rounded; each parameter is tried at a simple value, then rounded. The passes
repeat while one of them makes progress, until the deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from elasticbench.harness.functions import get_function
from elasticbench.harness.hunt.trial import Input, Trial
from elasticbench.harness.inputs.layouts import PACKED
from elasticbench.harness.numerics.dtypes import get_format

MAX_VALUE_BLOCKS = 64  # finest split of the values tried when setting them to the fill


@dataclass
class Shrunk:
    input: Input
    trial: Trial  # the failing trial of the smallest input
    steps: int  # trials it took


class Shrinker:
    def __init__(self, judge: Callable[[Input, str], Trial], dtype: str, function: str,
                 start: Input, trial: Trial, deadline: float, max_steps: int | None = None):
        self.judge, self.dtype, self.deadline = judge, dtype, deadline
        self.max_steps = max_steps
        self.fmt = get_format(dtype)
        self.params = get_function(function).params
        self.best, self.trial = start, trial
        self.kind = trial.failure
        self.steps = 0

    def _time_left(self) -> bool:
        return time.monotonic() < self.deadline and (self.max_steps is None
                                                     or self.steps < self.max_steps)

    def attempt(self, inp: Input) -> bool:
        """Keep inp when the kernel still fails on it the same way."""
        if not self._time_left():
            return False
        with np.errstate(over="ignore"):
            inp = replace(inp, x=self.fmt.cast(inp.x.astype(np.float64)))
        if np.array_equal(inp.x.view(np.uint8), self.best.x.view(np.uint8)) \
                and inp.layout == self.best.layout and inp.params == self.best.params:
            return False
        self.steps += 1
        trial = self.judge(inp, "shrink")
        if trial.failed and trial.failure == self.kind:
            self.best, self.trial = inp, trial
            return True
        return False

    def run(self) -> Shrunk:
        progress = True
        while progress and self._time_left():
            size = (self.best.elements, self.best.layout, self.best.params)
            before = self.best.x.tobytes()
            self.layout()
            self.rows()
            self.columns()
            self.values()
            self.parameters()
            progress = ((self.best.elements, self.best.layout, self.best.params) != size
                        or self.best.x.tobytes() != before)
        return Shrunk(self.best, self.trial, self.steps)

    # ---- the passes ------------------------------------------------------------------

    def layout(self) -> None:
        if self.best.layout != PACKED:
            self.attempt(replace(self.best, layout=PACKED))

    def rows(self) -> None:
        x = self.best.x
        worst = self.trial.record.worst or {}
        w = int(worst.get("row", x.shape[0] - 1))
        if x.shape[0] > 1 and 0 <= w < x.shape[0]:
            self.attempt(replace(self.best, x=x[w:w + 1]))
        self._bisect(axis=0)

    def columns(self) -> None:
        self._bisect(axis=1)

    def _bisect(self, axis: int) -> None:
        """The shortest prefix along axis that still fails, then the most leading entries
        that can go."""
        size = self.best.x.shape[axis]
        lo, hi = 1, size  # hi fails; find the smallest prefix that does
        while lo < hi and self._time_left():
            mid = (lo + hi) // 2
            if self.attempt(replace(self.best, x=_take(self.best.x, axis, 0, mid))):
                hi = mid
            else:
                lo = mid + 1
        self._cut_powers_of_two(axis)
        base = self.best
        size = base.x.shape[axis]
        lo, hi = 0, size - 1  # the most leading entries that can go: dropping 0 fails
        while lo < hi and self._time_left():
            mid = (lo + hi + 1) // 2
            if self.attempt(replace(self.best, x=_take(base.x, axis, mid, size))):
                lo = mid
            else:
                hi = mid - 1

    def _cut_powers_of_two(self, axis: int) -> None:
        """Prefixes shorter by 2^j, largest j first, while one still fails: a failure that
        needs a residue (n % 16 == 7, say) survives such cuts where bisection stops short."""
        cut = True
        while cut and self._time_left():
            size = self.best.x.shape[axis]
            cut = any(self.attempt(replace(self.best, x=_take(self.best.x, axis, 0, size - step)))
                      for step in (1 << j for j in range(size.bit_length() - 1, -1, -1))
                      if step < size)

    def values(self) -> None:
        flat = self.best.x.reshape(-1).view(np.uint8).reshape(self.best.x.size, -1)
        if (flat == flat[0]).all():  # one value everywhere: only a plainer number is simpler
            value = float(self.best.x.reshape(-1)[0])
            plainer = [] if value == 0.0 else [0.0] if value == 1.0 else [1.0, 0.0]
            for fill in plainer:
                if self.attempt(replace(self.best, x=np.full_like(self.best.x, fill))):
                    return
            return
        for fill in self._fills():
            if self.attempt(replace(self.best, x=np.full_like(self.best.x, fill))):
                return
        fill = self._fills()[0]
        for block in _blocks(self.best.x.size):
            x = self.best.x.copy().reshape(-1)
            x[block] = fill
            self.attempt(replace(self.best, x=x.reshape(self.best.x.shape)))
        for digits in (0, 1, 2):
            with np.errstate(invalid="ignore", over="ignore"):
                x = _round_significant(self.best.x.astype(np.float64), digits)
            self.attempt(replace(self.best, x=x))

    def _fills(self) -> list[float]:
        """Candidate fill values: the commonest value of the input first, then 1 and 0."""
        x = self.best.x.astype(np.float64).reshape(-1)
        values, counts = np.unique(x[np.isfinite(x)], return_counts=True)
        common = [float(values[np.argmax(counts)])] if values.size else []
        return list(dict.fromkeys([*common, 1.0, 0.0]))

    def parameters(self) -> None:
        for p in self.params:
            value = dict(self.best.params)[p.name]
            simple = [p.default, *(v for v in p.grid if v == round(v))]
            tries = [*simple, float(f"{value:.1g}"), float(f"{value:.2g}")]
            for v in dict.fromkeys(tries):
                if v == value:
                    break
                try:
                    v = p.validate(v)
                except ValueError:
                    continue
                params = tuple((k, v if k == p.name else old) for k, old in self.best.params)
                if self.attempt(replace(self.best, params=params)):
                    break


def _take(x: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    return x[start:stop] if axis == 0 else x[:, start:stop]


def _blocks(size: int) -> Iterator[slice]:
    """Halves, then quarters, ... down to MAX_VALUE_BLOCKS pieces of the flat input."""
    parts = 2
    while parts <= min(size, MAX_VALUE_BLOCKS):
        step = math.ceil(size / parts)
        for start in range(0, size, step):
            yield slice(start, min(size, start + step))
        parts *= 2


def _round_significant(x: np.ndarray, digits: int) -> np.ndarray:
    """Finite nonzero values rounded to `digits` decimals of their magnitude's leading digit
    (0: the leading digit alone); zeros, infinities and NaN untouched."""
    out = x.copy()
    ok = np.isfinite(x) & (x != 0)
    scale = 10.0 ** (np.floor(np.log10(np.abs(x[ok]))) - digits)
    out[ok] = np.round(x[ok] / scale) * scale
    return out
