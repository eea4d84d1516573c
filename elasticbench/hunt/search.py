"""The search: random exploration, plus small changes to the configurations that came
closest to failing (the largest share of their error budget), until one fails or time is up.

An evolutionary search of the simplest kind: a pool of the best configurations so far;
each step either draws a fresh configuration or changes one picked from the pool by a
tournament. Drawing fresh keeps it from settling on one corner; changing the best climbs
toward a kernel's weak spot (a band of tau where its error grows, a length where it starts
to lose accuracy) that a fresh draw hits only by luck.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from .space import Config, Space, make_input
from .trial import Input, Judge, Trial

POOL = 16
EXPLORE = 0.35  # chance of a fresh draw once the pool is full


@dataclass
class Found:
    config: Config
    trial: Trial


def config_input(c: Config) -> Input:
    return Input(c.label(), make_input(c), c.layout, c.params)


def search(space: Space, judge: Judge, rng: np.random.Generator, deadline: float,
           on_trial: Callable[[Trial], None], max_trials: int | None = None) -> Found | None:
    """Configurations tried until one fails (returned), the deadline (time.monotonic()) passes
    or max_trials were tried (None)."""
    pool: list[tuple[float, int, Config]] = []
    tried = 0
    while time.monotonic() < deadline and (max_trials is None or tried < max_trials):
        fresh = len(pool) < POOL // 2 or rng.random() < EXPLORE
        c = space.random(rng) if fresh else space.mutate(_pick(pool, rng), rng)
        trial = judge(config_input(c), c.dtype, "explore" if fresh else "mutate",
                      {"config": _config_dict(c)})
        tried += 1
        on_trial(trial)
        if trial.failed:
            return Found(c, trial)
        pool.append((trial.fraction, tried, c))
        pool.sort(key=lambda t: (-t[0], t[1]))
        del pool[POOL:]
    return None


def _pick(pool: list[tuple[float, int, Config]], rng: np.random.Generator) -> Config:
    """The best of three drawn from the pool."""
    picks = rng.choice(len(pool), size=min(3, len(pool)), replace=False)
    return pool[int(min(picks))][2]


def _config_dict(c: Config) -> dict:
    d = asdict(c)
    d["params"] = dict(c.params)
    d["spikes"] = [list(s) for s in c.spikes]
    return d
