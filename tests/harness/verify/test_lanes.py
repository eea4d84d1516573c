"""The second kernel lane (elasticbench/harness/verify/lanes.py): the same records as one process
makes, a lane that dies leaves its share to the parent, kernels that cannot travel stay."""

from __future__ import annotations

import dataclasses
import json

import pytest

from elasticbench.harness.numerics.truth.cache import TruthStore
from elasticbench.harness.registry import (
    get_kernel,
    load_kernel_file,
    register_kernel,
    scoped_kernels,
)
from elasticbench.harness.verify import lanes
from elasticbench.harness.verify.matrix import builtin_case, expand, load_matrix
from elasticbench.harness.verify.verifier import run_verification

NUMPY = ("numpy_elastic", "numpy_softmax", "numpy_softmax1", "numpy_stablemax")

# A kernel that dies in the lane's interpreter (python -m elasticbench.harness.worker) only: the
# parent then judges the lane's share itself.
DIES_IN_THE_LANE = '''
import os, sys
import numpy as np
from elasticbench import register_kernel
from elasticbench.harness.builtin.numpy_kernels import numpy_softmax

@register_kernel(function="softmax", backend="numpy", name="lane_killer")
def lane_killer(x):
    if sys.argv[0].endswith(os.path.join("harness", "worker.py")):
        os._exit(3)
    return numpy_softmax(x)
'''


def _judged(specs, monkeypatch, lanes_on: bool, answers: list | None = None) -> list:
    monkeypatch.setattr(lanes, "MIN_PAIRS", 0)  # the quick matrix is small: a lane anyway
    receive = lanes.Lane.receive

    def noted(self):
        got = receive(self)
        if answers is not None:
            answers.append(got)
        return got

    monkeypatch.setattr(lanes.Lane, "receive", noted)
    matrix = load_matrix(builtin_case("verify-quick"))
    cases = expand(matrix, sorted({s.function for s in specs}), ["fp32", "bf16"])
    records: list = []
    run_verification(specs, cases, max_elements=matrix.max_elements, store=TruthStore(None),
                     on_record=records.append, max_rows=matrix.max_rows, lanes=lanes_on)
    return records


def _by_key(records) -> dict:
    return {r.key: dataclasses.replace(r, seconds=0.0) for r in records}


def test_a_lane_makes_the_records_one_process_makes(monkeypatch):
    specs = [get_kernel(n) for n in NUMPY]
    share = lanes.lane_share(specs, lambda k: 10_000, cores=2)
    # none of them compiles: every other case goes to the lane, with all its kernels
    assert share is not None and not share.kernels
    assert share.of(0, specs) == [] and share.of(1, specs) == specs
    answers: list = []
    alone, shared = _judged(specs, monkeypatch, False), _judged(specs, monkeypatch, True, answers)
    assert answers and all(a is not None for a in answers)  # the lane judged every batch
    assert len(alone) == len(shared) > 100
    assert _by_key(alone) == _by_key(shared)
    assert {r.kernel for r in shared} == set(NUMPY)


def test_a_lane_that_dies_leaves_its_share_to_the_parent(monkeypatch, tmp_path):
    path = tmp_path / "killer.py"
    path.write_text(DIES_IN_THE_LANE)
    with scoped_kernels():
        killer = [s for s in load_kernel_file(path) if s.name == "lane_killer"]
        specs = [*killer, get_kernel("numpy_softmax")]
        share = lanes.lane_share(specs, lambda k: 10_000, cores=2)
        assert share is not None and share.of(1, specs) == specs
        answers: list = []
        records = _judged(specs, monkeypatch, True, answers)
    assert answers and all(a is None for a in answers)  # died on its first batch
    judged = [r for r in records if r.kernel == "lane_killer"]
    assert judged and all(r.passed for r in judged)  # all of them, judged here
    assert len(judged) == len([r for r in records if r.kernel == "numpy_softmax"])


def test_the_share_stays_home_on_one_core_small_work_or_for_kernels_that_cannot_travel():
    specs = [get_kernel(n) for n in NUMPY]
    assert lanes.lane_share(specs, lambda k: 10_000, cores=1) is None
    assert lanes.lane_share(specs, lambda k: 1, cores=2) is None  # under MIN_PAIRS
    assert lanes.lane_share(specs[:1], lambda k: 10_000, cores=2) is None
    with scoped_kernels():
        @register_kernel(function="softmax", backend="numpy", name="inline_softmax")
        def inline_softmax(x):  # registered here: a fresh interpreter would not find it
            return x

        inline = get_kernel("inline_softmax")
        assert not lanes.travels(inline) and lanes.travels(specs[0])
        share = lanes.lane_share([inline, *specs], lambda k: 10_000, cores=2)
        assert share is not None and share.of(1, [inline, *specs]) == specs


COMPILING = '''
from elasticbench import register_kernel

for i in range(3):
    register_kernel(function="softmax", backend="numpy", name=f"jit_{i}",
                    compiles=True)(lambda x: x)
'''


def test_a_compiling_kernel_stays_in_one_process_for_every_case(tmp_path):
    path = tmp_path / "jit.py"
    path.write_text(COMPILING)
    assert get_kernel("compiled_elastic").compiles  # the torch backend's default
    assert not get_kernel("torch_elastic").compiles  # said so at its registration
    with scoped_kernels():
        made = sorted(load_kernel_file(path), key=lambda k: k.name)
        plain = get_kernel("numpy_softmax")
        assert all(k.compiles for k in made) and not plain.compiles
        share = lanes.lane_share([*made, plain], lambda k: 10_000, cores=2)
        assert share is not None and share.kernels == {("jit_0", "fwd"), ("jit_2", "fwd")}
        for position in range(4):  # the same compiling kernels on every case
            mine = share.of(position, [*made, plain])
            assert [k.name for k in mine if k.compiles] == ["jit_0", "jit_2"]
            assert (plain in mine) == (position % 2 == 1)


@pytest.mark.parametrize("keep", [True, False])
def test_a_kept_batch_is_read_twice_then_gone(tmp_path, keep):
    import numpy as np

    from elasticbench.harness import handoff

    a = np.arange(1 << 15, dtype=np.float64)
    packed = handoff.pack({"a": a}, tmp_path)
    first = handoff.unpack(packed, keep=keep)
    assert np.array_equal(first["a"], a)
    assert bool(list(tmp_path.iterdir())) == keep
    if keep:
        assert np.array_equal(handoff.unpack(packed)["a"], a)
        assert not list(tmp_path.iterdir())


def test_a_whole_pack_is_one_file_read_once(tmp_path):
    from elasticbench.harness import handoff

    records = [{"kernel": f"k{i}", "max_ulp": i / 3} for i in range(2000)]
    packed = handoff.pack(records, tmp_path, whole=True)
    assert len(packed) < 200 and len(list(tmp_path.iterdir())) == 1
    assert handoff.unpack(packed) == records and not list(tmp_path.iterdir())
    handoff.discard(handoff.pack(records, tmp_path, whole=True))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("one_lane", [False, True])
def test_verify_shares_its_kernels_unless_told_one_lane(cli, monkeypatch, tmp_path, one_lane):
    monkeypatch.setattr(lanes, "MIN_PAIRS", 0)
    monkeypatch.setattr(lanes.os, "cpu_count", lambda: 2)
    sent: list[int] = []
    send = lanes.Lane.send
    monkeypatch.setattr(lanes.Lane, "send", lambda self, *a: sent.append(1) or send(self, *a))
    out = tmp_path / "v.json"
    args = ["verify", "--quick", "-b", "numpy", "-f", "softmax,softmax1", "-d", "fp32",
            "--json", str(out)] + (["--one-lane"] if one_lane else [])
    r = cli(*args)
    assert r.code == 0, r.out + r.err
    assert bool(sent) is not one_lane
    kernels = {rec["kernel"] for rec in json.loads(out.read_text())["records"]}
    assert kernels == {"numpy_softmax", "numpy_softmax1"}


class _Ahead:
    """Three batches of two cases, every truth in at once."""

    def __init__(self, events: list) -> None:
        self.events, self.taken = events, 0

    def left(self) -> bool:
        return self.taken < 3

    def ready(self) -> bool:
        return self.left()

    def take(self):
        from types import SimpleNamespace

        b = self.taken
        self.taken += 1
        self.events.append(("taken", b))
        prepared = [SimpleNamespace(mode="fwd", case=(b, i)) for i in range(2)]
        return prepared, [None, None], f"batch {b}".encode()


class _Lane:
    """Answers each batch at once, with one record per kernel of its share."""

    def __init__(self, events: list) -> None:
        self.events, self.alive, self.held = events, True, []

    def send(self, handed: bytes, share) -> bool:
        self.events.append(("sent", handed.decode()))
        self.held.append([spec for specs in share for spec in specs])
        return True

    def ready(self) -> bool:
        return bool(self.held)

    def receive(self):
        return [f"lane {spec.name}" for spec in self.held.pop(0)]


def test_the_lane_gets_its_batches_before_the_parent_has_judged_its_own():
    from elasticbench.harness.verify.schedule import judge_batches

    events: list = []
    share = lanes.Share(frozenset())  # plain kernels: every other case to the lane

    specs = [get_kernel("numpy_softmax"), get_kernel("numpy_softmax1")]
    judged, emitted = [], []
    judge_batches(_Ahead(events), _Lane(events), lambda mode, case: specs, share,
                  lambda prep, truth, ks: judged.append((prep.case, [k.name for k in ks]))
                  or events.append(("judged", prep.case[0])),
                  lambda spec, case, record: emitted.append((case, record)), None)
    # the first two batches went to the lane before the parent judged a case of the first
    first_judged = events.index(("judged", 0))
    assert events[:first_judged] == [("taken", 0), ("sent", "batch 0"),
                                     ("taken", 1), ("sent", "batch 1")]
    # the parent judged the even cases, the lane the odd ones, every kernel once
    assert sorted(c for c, _ in judged) == [(b, 0) for b in range(3) for _ in specs]
    assert sorted(c for c, _ in emitted) == [(b, 1) for b in range(3) for _ in specs]
    assert [r for _, r in emitted] == ["lane numpy_softmax", "lane numpy_softmax1"] * 3
