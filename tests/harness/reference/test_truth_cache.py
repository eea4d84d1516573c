"""The reference's cache: only what mpmath computed, least recently used first out."""

from __future__ import annotations

import os
import time

import numpy as np

from elasticbench.harness.numerics.truth.cache import TruthJob, TruthStats, TruthStore, solve
from elasticbench.harness.numerics.truth.row_truth import evaluate_rows


def _truth(seed: int, n: int = 2000):
    x = np.random.default_rng(seed).normal(size=(4, n))
    return evaluate_rows("softmax", {}, x, np.arange(4))


def test_the_store_drops_the_least_recently_used_past_its_limit(tmp_path):
    first = _truth(0)
    store = TruthStore(tmp_path, max_mb=0.0)
    store.max_bytes = 10**9
    store.put("aa" * 32, first)
    one = store.size()
    store.max_bytes = int(2.5 * one)  # room for two entries
    store.put("bb" * 32, _truth(1))
    past = time.time() - 100
    os.utime(store._path("aa" * 32), (past, past))
    os.utime(store._path("bb" * 32), (past - 50, past - 50))
    assert store.get("aa" * 32) is not None  # read: now the most recently used
    store.put("cc" * 32, _truth(2))
    assert store.get("bb" * 32) is None  # the least recently used went
    assert store.get("aa" * 32) is not None and store.get("cc" * 32) is not None
    assert store.size() <= store.max_bytes


def test_only_the_rows_left_to_mpmath_are_cached(tmp_path):
    """stablemax on one-element rows is exactly 1, a power of two the certified phase cannot
    tell a side of; the other rows of the same input are certified and never stored."""
    x = np.random.default_rng(3).normal(size=(6, 1))
    wide = np.random.default_rng(4).normal(size=(6, 500))
    jobs = [TruthJob("stablemax", (), "fp32", x, np.arange(6), 128),
            TruthJob("stablemax", (), "fp32", wide, np.arange(6), 128)]
    store = TruthStore(tmp_path)
    stats = TruthStats()
    truths = solve(jobs, store, workers=1, stats=stats)
    assert stats.fallback_rows == 6 and stats.fallback_elements == 6
    assert stats.elements == 6 + 3000 and stats.cached_elements == 0
    assert len(list((tmp_path / "truth").glob("*/*.npz"))) == 1
    assert (truths[0].hi == 1.0).all() and (truths[0].lo == 0.0).all()
    again = TruthStats()
    solve(jobs, store, workers=1, stats=again)
    assert again.cached_elements == 6
    assert "0.20% by mpmath" in stats.summary()


def test_a_bad_cache_limit_is_one_line(cli, monkeypatch):
    monkeypatch.setenv("ELASTICBENCH_CACHE_MB", "lots")
    r = cli("verify", "--quick")
    assert r.code == 2
    assert "ELASTICBENCH_CACHE_MB must be a number of megabytes >= 0, got 'lots'" in r.err
    assert "Traceback" not in r.err
