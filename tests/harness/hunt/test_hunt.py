"""`elasticbench hunt`: finds a failure a kernel hides on one path, shrinks it, saves a case
file that `verify --case` replays; passes a correct kernel; every trial is a record."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from elasticbench.harness.execute import IN_PROCESS
from elasticbench.harness.hunt.job import HuntJob
from elasticbench.harness.hunt.space import Space, make_input
from elasticbench.harness.hunt.trial import Input, Judge
from elasticbench.harness.registry import get_kernel
from elasticbench.harness.selftest.mutants import PATH_MUTANTS
from elasticbench.harness.session import Session
from elasticbench.harness.verify.matrix import load_matrix

ROWS_BUG = textwrap.dedent("""
    import numpy as np
    from elasticbench import register_kernel
    from elasticbench.harness.builtin.numpy_kernels import numpy_elastic

    @register_kernel(function="elastic", backend="numpy", name="late_rows")
    def late_rows(x, *, tau, beta):
        y = numpy_elastic(x, tau=tau, beta=beta)
        if x.shape[0] > 300:  # a second launch block that drops the offset
            y[300:] = numpy_elastic(x[300:], tau=tau, beta=0.0)
        return y
""")


def test_hunt_finds_shrinks_and_saves_a_case_that_verify_replays(cli, tmp_path):
    (tmp_path / "k.py").write_text(ROWS_BUG)
    out = tmp_path / "h.json"
    r = cli("hunt", "--kernel-file", str(tmp_path / "k.py"), "--dtype", "fp32", "--budget",
            "60", "--seed", "3", "--max-trials", "200", "--json", str(out))
    assert r.code == 1, r.out + r.err
    assert "FAIL late_rows" in r.out and "shrunk in" in r.out
    doc = json.loads(out.read_text())
    summary = doc["hunt"]["kernels"][0]
    assert summary["failed"] and doc["complete"]
    assert summary["shrunk"]["elements"] * 10 <= summary["first"]["elements"]
    assert summary["shrunk"]["shape"][0] == 301  # just past the block: fewest rows
    assert 0 < summary["first"]["seconds"] < summary["seconds"]  # shrinking came after
    assert f"configurations ({summary['first']['seconds']:.1f} s)" in r.out
    # every configuration tried is a record, the shrinking trials too
    assert len(doc["records"]) == summary["trials"]
    phases = {rec["hunt"]["phase"] for rec in doc["records"]}
    assert "shrink" in phases and phases & {"explore", "mutate"}
    case = Path(summary["shrunk"]["case"])
    text = case.read_text()
    assert "fill = 1.0" in text or "fill = 0.0" in text  # simplest values
    replay = cli("verify", "--case", str(case), "--kernel-file", str(tmp_path / "k.py"),
                 "--only", "late_rows")
    assert replay.code == 1 and "1 failed" in replay.out
    good = cli("verify", "--case", str(case), "--only", "numpy_elastic")
    assert good.code == 0, good.out


def test_hunt_passes_a_correct_kernel_and_exits_0(cli, tmp_path):
    out = tmp_path / "h.json"
    r = cli("hunt", "--only", "numpy_softmax", "--budget", "30", "--max-trials", "25",
            "--max-elements", "65536", "--json", str(out))
    assert r.code == 0, r.out + r.err
    assert "pass numpy_softmax: 25 configurations" in r.out
    doc = json.loads(out.read_text())
    assert len(doc["records"]) == 25 and all(rec["passed"] for rec in doc["records"])
    assert not list(tmp_path.glob("*.toml"))
    # the reference's fallback share, as verify reports it: every checked value counted once
    ref = doc["reference"]
    assert ref["elements"] == sum(rec["rows_checked"] * rec["shape"][1]
                                  for rec in doc["records"])
    assert ref["fallback_share"] == ref["fallback_elements"] / ref["elements"]
    assert f"reference: {ref['elements']:,} values, " in r.out
    # the kernel's own share of the time: its records' call seconds over the search's
    summary = doc["hunt"]["kernels"][0]
    assert summary["kernel_s"] == pytest.approx(sum(rec["seconds"] for rec in doc["records"]))
    share = min(1.0, summary["kernel_s"] / summary["seconds"])
    assert f"{share:.0%} of it in the kernel" in r.out


def test_hunt_is_reproducible_from_its_seed():
    space = Space("elastic", ["fp32", "bf16"], ["packed", "padded", "transposed"])
    a = [space.random(np.random.default_rng(5)) for _ in range(3)]
    b = [space.random(np.random.default_rng(5)) for _ in range(3)]
    assert a == b
    assert np.array_equal(make_input(a[0]).view(np.uint8), make_input(b[0]).view(np.uint8))


def test_long_fp32_rows_draw_from_a_palette_so_the_reference_stays_cheap():
    space = Space("softmax", ["fp32"], ["packed"])
    rng = np.random.default_rng(1)
    long = [c for c in (space.random(rng) for _ in range(200)) if c.n > 4096]
    assert long and all(c.palette and c.palette <= 2048 for c in long)
    assert all(c.elements <= 1 << 23 for c in long)
    x = make_input(long[0])
    assert all(np.unique(row).size <= long[0].palette for row in x[:4])


def test_sizes_past_small_are_kept_as_often_as_their_cost_allows():
    # a configuration costs about its elements: past SMALL it is kept with probability
    # SMALL/elements (LONG times that with at most FEW rows), so the search stays cheap on
    # average and long rows still come up
    from elasticbench.harness.hunt.space import FEW, LONG, SMALL, kept

    rng = np.random.default_rng(3)
    space = Space("elastic", ["fp64", "fp32", "fp16", "bf16"], ["packed", "transposed"])
    some = space.random(rng)
    for rows, n, odds in ((64, 1 << 16, SMALL / (64 << 16)), (1, 1 << 22, LONG * SMALL / (1 << 22)),
                          (FEW, 1 << 20, LONG * SMALL / (FEW << 20)), (2, 1000, 1.0)):
        c = replace(some, rows=rows, n=n)
        share = np.mean([kept(c, rng) for _ in range(4000)])
        assert abs(share - odds) < 0.03, (rows, n, share, odds)
    drawn = [space.random(rng) for _ in range(4000)]
    sizes = np.array([c.elements for c in drawn])
    assert np.mean(sizes > SMALL) < 0.2 and sizes.mean() < 4 * SMALL
    assert any(c.n >= 1 << 20 for c in drawn) and any(c.rows >= 1 << 15 for c in drawn)
    # a change whose size is turned away is no change: the search draws afresh
    big = replace(some, rows=64, n=1 << 17)
    turned = [space.mutate(big, rng) for _ in range(200)]
    assert 150 < sum(t is None for t in turned) < 200


WHERE = {  # where each path mutant is wrong: the failure found must be there
    "multi_block_unscaled": lambda c: c.n > 65536,
    "row_block_stale_max": lambda c: c.rows > 512,
    "tau_table": lambda c: 2 < dict(c.params)["tau"] < 8,
    "exp_band": lambda c: True,
    "packed_rows": lambda c: c.layout != "packed",
}


@pytest.mark.parametrize("mutant", PATH_MUTANTS, ids=lambda m: m.spec.name)
def test_hunt_catches_each_path_mutant_in_a_bounded_number_of_trials(mutant, tmp_path):
    job = HuntJob([mutant.spec], ["fp32", "fp64"], budget=60.0, seed=1,
                  case_stem=tmp_path / "h", max_trials=100, max_shrink=5, max_elements=1 << 18)
    session = Session("verify", None, {})
    assert session.run(job)
    (hunted,) = job.results
    assert hunted.found is not None, mutant.spec.name
    assert WHERE[mutant.spec.name](hunted.found.config)
    assert hunted.case_path is not None
    load_matrix(hunted.case_path)  # a valid case file


def test_a_trial_is_a_verify_record_of_the_hunts_input():
    judge = Judge(get_kernel("numpy_elastic"), isolation=IN_PROCESS)
    x = np.array([[0.5, -1.0, 2.0]], dtype=np.float32)
    t = judge(Input("mine", x, "padded", (("tau", 1.0), ("beta", 1.0))), "fp32", "shrink")
    assert t.record.passed and t.record.input == "mine"
    assert t.record.layout == "padded" and t.record.hunt["phase"] == "shrink"
    assert 0 <= t.fraction < 1 and t.failure is None


@pytest.mark.parametrize(("args", "message"), [
    (("--budget", "0"), "--budget must be a positive"),
    (("--mode", "sideways"), "unknown --mode"),
    (("--dtype", "fp8"), "unknown dtype 'fp8'"),
    (("--only", "nope"), "unknown kernel 'nope'"),
    (("--kernel-file", "nope.py"), "does not exist"),
    (("--json", "/proc/nope/h.json"), "cannot write results file"),
])
def test_bad_usage_is_one_line_and_exit_2(cli, args, message):
    r = cli("hunt", *args)
    assert r.code == 2 and message in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


SLOW = textwrap.dedent("""
    import time
    from elasticbench import register_kernel
    from elasticbench.harness.builtin.numpy_kernels import numpy_softmax

    @register_kernel(function="softmax", backend="numpy", name="slow")
    def slow(x):
        time.sleep(0.05)
        return numpy_softmax(x)
""")


def test_an_interrupted_hunt_keeps_what_it_tried(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    out = tmp_path / "h.json"
    # Ctrl-C's default restored in the child: a shell ignores SIGINT in what it starts in the
    # background (a CI runner's `.ci/run &`), Python keeps it ignored, and the hunt ran on.
    # Its output goes to files and the test waits for the process itself; -X faulthandler:
    # a hunt still running 60 s after the interrupt dumps every thread's stack on SIGABRT.
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "elasticbench",
                                 "hunt", "--kernel-file", str(tmp_path / "slow.py"), "--budget",
                                 "120", "--json", str(out)],
                                stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline:
        if out.exists() and json.loads(out.read_text())["records"]:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=30)
        pytest.fail("the hunt did not stop within 60 s of the interrupt:\n"
                    + log.read_text()[-6000:])
    err = log.read_text()
    assert proc.returncode == 130, err
    assert "interrupted:" in err and "Traceback" not in err
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["records"]
    assert doc["hunt"]["kernels"][0]["trials"] == len(doc["records"])


def test_shrinking_keeps_a_residue_of_the_column_count_that_bisection_cannot():
    from elasticbench.harness.hunt.shrink import Shrinker
    from elasticbench.harness.registry import register_kernel, scoped_kernels

    with scoped_kernels():
        @register_kernel(function="elastic", backend="numpy", name="tail7")
        def tail7(x, *, tau, beta):  # the last element left out where n % 16 == 7, n > 100
            y = get_kernel("numpy_elastic").fn(x, tau=tau, beta=beta)
            if x.shape[1] > 100 and x.shape[1] % 16 == 7:
                y = get_kernel("numpy_elastic").fn(x[:, :-1], tau=tau, beta=beta)
                y = np.concatenate([y, np.zeros_like(y[:, :1])], axis=1)
            return y

        judge = Judge(get_kernel("tail7"), isolation=IN_PROCESS)
        x = np.random.default_rng(0).uniform(0, 1, (4, 631)).astype(np.float32)
        start = Input("uniform", x, "packed", (("tau", 1.0), ("beta", 1.0)))
        first = judge(start, "fp32", "explore")
        assert first.failed
        shrunk = Shrinker(lambda i, phase: judge(i, "fp32", phase), "fp32", "elastic", start,
                          first, time.monotonic() + 60).run()
    assert shrunk.input.x.shape == (1, 103)  # the shortest row with n % 16 == 7 past 100


def test_sorted_rows_are_sorted_in_every_format():
    """Rows are sorted ascending with NaN last in every format: NumPy 2.4's own sort leaves
    a 2^22-element fp16 row unsorted, and puts bfloat16 NaNs anywhere. A palette row is
    sorted by counting its picks, the same values as sorting the row."""
    from elasticbench.harness.hunt.space import sorted_picks, sorted_rows
    from elasticbench.harness.numerics.dtypes import get_format

    rng = np.random.default_rng(3)
    row = -np.abs(rng.normal(size=(1, 1 << 22))).astype(np.float16)
    got = sorted_rows(row).astype(np.float64)
    assert (np.diff(got, axis=1) >= 0).all()
    assert np.array_equal(np.sort(got, axis=1), np.sort(row.astype(np.float64), axis=1))
    bf = get_format("bf16").numpy
    with_nan = np.array([[2.0, np.nan, -1.0, -np.inf, 0.5, np.inf]]).astype(bf)
    assert np.array_equal(sorted_rows(with_nan).astype(np.float64)[0, :5],
                          [-np.inf, -1.0, 0.5, 2.0, np.inf])
    assert np.isnan(float(sorted_rows(with_nan)[0, 5]))
    # a long 16-bit row is sorted by counting its bit patterns: NaN last, -0 before +0
    long_bf = rng.normal(size=(2, 1 << 15)).astype(bf)
    long_bf[0, :4] = np.array([np.nan, 0.0, -0.0, -np.inf]).astype(bf)
    got = sorted_rows(long_bf)
    want = np.sort(long_bf.astype(np.float32), axis=1)
    assert np.array_equal(got.astype(np.float32), want, equal_nan=True)
    zeros = np.flatnonzero(got[0].astype(np.float32) == 0)
    assert list(np.signbit(got[0, zeros].astype(np.float32))) == [True, False]
    palette = rng.normal(size=(3, 40)).astype(np.float32)
    pick = rng.integers(0, 40, (3, 5000))
    want = np.sort(np.take_along_axis(palette, pick, axis=1), axis=1)
    assert np.array_equal(sorted_picks(palette, pick), want)


def _hunted_configs(tmp_path, name: str) -> list[dict]:
    job = HuntJob([get_kernel("numpy_elastic")], ["fp32", "bf16"], budget=600.0, seed=4,
                  case_stem=tmp_path / name, max_trials=40, max_elements=1 << 16)
    session = Session("verify", None, {})
    assert session.run(job)
    return [r.hunt["config"] for r in session.records]


def test_a_batched_search_retraces_the_same_configurations_from_its_seed(tmp_path):
    """Batches are drawn from the pool at fixed points, not when a reference process
    happens to finish: two runs of one seed judge the same 40 configurations in order."""
    first = _hunted_configs(tmp_path, "a")
    assert len(first) == 40 and len({json.dumps(c, sort_keys=True) for c in first}) > 30
    assert _hunted_configs(tmp_path, "b") == first


def test_a_reference_process_that_dies_in_a_hunt_is_one_line(cli, tmp_path, monkeypatch):
    """A hunt's reference process killed (as the OOM killer does): exit 2, one line naming
    the configuration, no traceback, the results file kept."""
    import os

    from elasticbench.harness.hunt import search as hunt_search

    def killed(*_args, **_kw):
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(hunt_search, "config_input", killed)  # runs in the forked process
    out = tmp_path / "h.json"
    r = cli("hunt", "--only", "numpy_softmax", "--budget", "20", "--json", str(out))
    assert r.code == 2, r.out + r.err
    last = r.err.strip().splitlines()[-1]
    assert last.startswith("elasticbench: error: the reference process died")
    assert "hunt configuration" in last and "Traceback" not in r.err
    assert json.loads(out.read_text())["complete"] is False


def test_a_search_that_stops_early_leaves_no_input_behind():
    """The batches that reference processes hand over as files are removed when a search
    ends before judging them (here at its first failure, batches still queued)."""
    from elasticbench.harness.hunt.search import BATCH, Queue, ahead, search

    mutant = next(m for m in PATH_MUTANTS if m.spec.name == "exp_band")  # wrong on a band
    space = Space("elastic", ["fp32"], ["packed"], 1 << 14)
    with ahead(2) as workers:
        queue = Queue(space, np.random.default_rng(0), "elastic", "fwd", 128, workers)
        found = search(queue, Judge(mutant.spec), time.monotonic() + 600, lambda t: None)
        workers.pool.shutdown(wait=True)
        assert found is not None and found.trial.record.hunt["trial"] < BATCH  # mid-batch
        assert not list(workers.folder.iterdir())


def _slow_truths(monkeypatch, seconds: float) -> None:
    """A reference process's first configuration input `seconds` late (the others on time,
    so that what is queued behind it does not keep the test waiting)."""
    from elasticbench.harness.hunt import search as hunt_search

    made = hunt_search.config_input
    first = [True]  # per process: each forked one has its own copy

    def late(*args, **kw):
        if first[0]:
            first[0] = False
            time.sleep(seconds)
        return made(*args, **kw)

    monkeypatch.setattr(hunt_search, "config_input", late)  # runs in the forked process


def test_a_search_does_not_wait_for_truths_past_its_deadline(monkeypatch):
    """Truths that come after the kernel's share (rows left to mpmath can take seconds) are
    not waited for: the search ends at its deadline, having judged nothing, and the batch's
    files are removed when it arrives."""
    from elasticbench.harness.hunt.search import Queue, ahead, search

    _slow_truths(monkeypatch, 6.0)
    space = Space("softmax", ["fp32"], ["packed"], 1 << 10)
    judged = []
    with ahead(1) as workers:
        queue = Queue(space, np.random.default_rng(0), "softmax", "fwd", 128, workers)
        started = time.monotonic()
        found = search(queue, Judge(get_kernel("numpy_softmax")), started + 1.0, judged.append)
        ended = time.monotonic() - started
        workers.pool.shutdown(wait=True)
        assert found is None and judged == [] and ended < 5.0
        assert not list(workers.folder.iterdir())


def test_a_kernel_with_nothing_judged_is_untried_not_passed(cli, tmp_path, monkeypatch):
    """A kernel whose share of the budget ended before any configuration was judged has no
    verdict: the line says UNTRIED, the summary counts it, its record says so."""
    _slow_truths(monkeypatch, 4.0)
    out = tmp_path / "h.json"
    r = cli("hunt", "--only", "numpy_softmax", "--budget", "1", "--json", str(out))
    assert r.code == 0, r.out + r.err
    assert "UNTRIED numpy_softmax" in r.out and "pass numpy_softmax" not in r.out
    assert "0 of 1 kernels failed, 1 untried; 0 configurations" in r.out
    kernels = json.loads(out.read_text())["hunt"]["kernels"]
    assert kernels[0]["untried"] is True and kernels[0]["trials"] == 0
