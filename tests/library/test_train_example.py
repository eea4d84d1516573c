"""examples/train.py's comparison of the attention family: a few steps of every function on
every task (in this process, tiny sizes, seconds), the gated, several-head and parallel
runs, the signed task's data checked by hand, the probes' statistics on weights whose
values are known, and the probes' weights against what each layer computes."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("train_example", ROOT / "examples" / "train.py")
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)

TINY = ["--attention", "all", "--task", "all", "--steps", "3", "--every", "1", "--warmup", "1",
        "--length", "8", "--batch", "4", "--eval-batch", "3", "--d-model", "16", "--heads", "2",
        "--layers", "2", "--threads", "1", "--groups", "4"]
# the new options at once: the gate both ways, two head counts, two runs at a time, the
# results files
GATED = ["--attention", "sdpa,elastic,cog", "--task", "signed", "--gate", "both", "--heads",
         "1,2", "--jobs", "2", "--steps", "2", "--every", "1", "--warmup", "1", "--length",
         "6", "--batch", "4", "--eval-batch", "3", "--d-model", "8", "--layers", "1",
         "--groups", "4"]
GATE0 = 1 / (1 + math.exp(-train.GATE_BIAS))  # every gate value before the first step


def _main(argv: list[str]) -> None:
    threads = torch.get_num_threads()
    try:
        train.main(argv)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("train_example")
    _main([*TINY, "--json", str(out / "run.json"), "--table", str(out / "table.md")])
    return json.loads((out / "run.json").read_text()), (out / "table.md").read_text()


@pytest.fixture(scope="module")
def gated(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("train_gated")
    _main([*GATED, "--json", str(out / "run.json"), "--results", str(out / "results")])
    return json.loads((out / "run.json").read_text()), out / "results"


def test_every_function_trains_on_every_task_with_its_probes_in_range(tiny):
    doc, _ = tiny
    runs = {(r["task"], r["attention"]): r for r in doc["runs"]}
    assert list(runs) == [(t, k) for t in train.TASKS for k in train.KINDS]
    for (task, kind), r in runs.items():
        assert len(r["train_loss"]) == 3 and all(math.isfinite(v) for v in r["train_loss"])
        assert r["timed_steps"] == 2  # the warm-up step is trained, not timed
        assert math.isfinite(r["ms_per_step"]) and r["ms_per_step"] > 0
        assert (r["implementation"] == "torch sdpa") == (kind == "sdpa"), r["implementation"]
        assert math.isfinite(r["cpu_ms_per_step"]) and r["cpu_ms_per_step"] > 0
        assert r["gate"] is False and r["heads"] == 2
        assert [e["step"] for e in r["evals"]] == [0, 1, 2, 3]
        for e in r["evals"]:
            assert math.isfinite(e["loss"]) and 0 <= e["acc"] <= 1, (task, kind, e)
            assert 0 <= e["sink"] <= 1 or kind == "cog"
            assert 0 <= e["zero"] <= 1 and 0 <= e["empty"] <= 1
            assert 0 <= e["entropy"] <= 1 + 1e-9, (task, kind, e)
            assert "gate" not in e  # ungated
            if kind == "cog":  # signed, |w| summing to 1: some weights below 0 at random q, k
                assert 0 < e["negative"] < 1 and -1 - 1e-6 <= e["total_min"] <= e["total"] < 1
            else:
                assert e["negative"] == 0 and 0 <= e["total_min"] <= e["total"]
            if kind in ("sdpa", "stablemax"):  # normalized, no offset: every query sums to 1
                assert e["total"] == pytest.approx(1, abs=1e-6)
                assert e["total_min"] == pytest.approx(1, abs=1e-6)
            elif kind == "sigmoid":  # each weight in (0, 1): a total up to the keys seen
                assert 0 < e["total"] < 8
            else:  # an offset in the denominator, or signs: below 1 on average
                assert e["total"] < 1, (task, kind, e)
            if kind in ("stablemax", "sigmoid", "cog"):  # no weight of these is 0 here
                assert e["zero"] == 0
            assert ("roles" in e) == (task == "signed")
        # the uniform baseline: 1/8 without a mask; causal, the mean of 1/(i+1), i = 1..7
        uniform = 1 / 8 if task != "chars" else sum(1 / n for n in range(2, 9)) / 7
        assert r["evals"][0]["uniform_sink"] == pytest.approx(uniform)


def test_learned_parameters_are_reported_per_head_and_move(tiny):
    doc, _ = tiny
    for r in doc["runs"]:
        kind = r["attention"]
        first, last = r["evals"][0]["params"], r["evals"][-1]["params"]
        names = {"elastic": ["tau", "beta"], "symax": ["eta"], "sigmoid": ["bias"]}.get(kind, [])
        assert list(first) == names, kind
        for name in names:
            assert len(first[name]) == 2 * 2  # two layers of two heads
            start = {"tau": 1.0, "beta": 1.0, "eta": 1.0, "bias": -math.log(8)}[name]
            assert first[name] == pytest.approx([start] * 4, rel=1e-6), (kind, name)
            assert last[name] != pytest.approx(first[name], abs=1e-6), (kind, name)


def test_summary_table_has_every_function_of_every_task(tiny):
    doc, text = tiny
    for task in train.TASKS:
        assert f"**{task}** (3 steps;" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| attention")]
    assert [row.split("|")[1].strip() for row in rows] == list(train.KINDS) * 3
    for row, r in zip(rows, doc["runs"], strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[:3] == [r["attention"], "off", "2"]
        assert f"| {r['evals'][-1]['loss']:.3f} |" in row
        # the signed task's rows end with the role weights of one layer.head
        assert len(cells) == len(train.COLUMNS) + (r["task"] == "signed")


def test_gated_runs_at_two_head_counts_in_two_processes(gated):
    doc, _ = gated
    got = [(r["heads"], r["attention"], r["gate"]) for r in doc["runs"]]
    assert got == [(h, k, g) for h in (1, 2) for k in ("sdpa", "elastic", "cog")
                   for g in (False, True)]
    assert doc["options"]["jobs"] == 2 and doc["cpu_seconds"] > 0
    for r in doc["runs"]:
        first, last = r["evals"][0], r["evals"][-1]
        assert len(r["train_loss"]) == 2 and all(math.isfinite(v) for v in r["train_loss"])
        if r["gate"]:
            # W_g = 0 and b_g = 4 before the first step: every gate value is sigmoid(4)
            assert first["gate"] == pytest.approx(GATE0, rel=1e-6) and first["gate_low"] == 0
            assert first["params"]["gate_bias"] == pytest.approx([4.0] * r["heads"])
            assert last["params"]["gate_bias"] != pytest.approx([4.0] * r["heads"], abs=1e-6)
            assert last["gate"] != pytest.approx(GATE0, abs=1e-7)
        else:
            assert "gate" not in first and "gate_bias" not in first["params"]
        roles = last["roles"]
        assert list(roles) == list(train.ROLES)
        assert all(len(roles[n]) == 1 and len(roles[n][0]) == r["heads"] for n in roles)
        if r["attention"] != "cog":  # nonnegative weights, and softmax's sum to 1
            assert all(v >= 0 for n in roles for v in roles[n][0])


def test_gated_and_ungated_runs_differ_and_start_alike(gated):
    doc, _ = gated
    runs = {(r["heads"], r["attention"], r["gate"]): r for r in doc["runs"]}
    for heads in (1, 2):
        for kind in ("sdpa", "elastic", "cog"):
            off, on = runs[heads, kind, False], runs[heads, kind, True]
            # g = 0.982 everywhere scales the attention's output: a near but other loss
            assert on["train_loss"][0] == pytest.approx(off["train_loss"][0], rel=0.05)
            assert on["train_loss"][0] != off["train_loss"][0]


def test_results_files_are_the_docs_tables_and_the_curves(gated):
    doc, folder = gated
    table = json.loads((folder / "signed.json").read_text())
    assert set(table) == {"title", "date", "machine", "command", "conditions", "columns",
                          "rows"}
    assert table["columns"] == [*train.COLUMNS, train.ROLE_COLUMN]
    assert table["command"].startswith("python examples/train.py --attention sdpa,elastic,cog")
    assert [row[:3] for row in table["rows"]] == [
        [k, g, str(h)] for h in (1, 2) for k in ("sdpa", "elastic", "cog") for g in ("off", "on")]
    assert all(len(row) == len(table["columns"]) for row in table["rows"])
    with open(folder / "curves.csv", newline="") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == 12 * 3  # every run's evaluations at steps 0, 1, 2
    first = lines[0]
    assert (first["task"], first["heads"], first["attention"], first["gate"], first["step"]) == (
        "signed", "1", "sdpa", "0", "0")
    assert float(first["loss"]) == pytest.approx(doc["runs"][0]["evals"][0]["loss"], rel=1e-5)
    gated_first = lines[3]  # sdpa, gated, step 0
    assert gated_first["gate"] == "1" and float(gated_first["gate_mean"]) == pytest.approx(
        GATE0, rel=1e-5)


def test_from_json_writes_the_same_results_without_training(gated, tmp_path, capsys):
    _, folder = gated
    run = folder.parent / "run.json"
    _main(["--from-json", str(run), "--results", str(tmp_path)])
    assert (tmp_path / "signed.json").read_text() == (folder / "signed.json").read_text()
    assert (tmp_path / "curves.csv").read_text() == (folder / "curves.csv").read_text()
    assert " step " not in capsys.readouterr().out  # nothing trained


@pytest.mark.ci  # matplotlib's import and a many-panel render: seconds of a core, for no value
def test_figure_is_written(tiny, gated, tmp_path):
    pytest.importorskip("matplotlib")
    # every task, the gate both ways, two head counts and the signed task's role bars
    train.plot(tiny[0]["runs"] + gated[0]["runs"], str(tmp_path / "fig.png"))
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_signed_task_by_hand():
    # groups 0..5 paired 0-1, 2-3, 4-5; the query itself counts in its own group
    x = torch.tensor([[0, 1, 1, 1, 2, 0, 5]])
    # position 0 (group 0): own {0, 5} 2, paired (1) {1, 2, 3} 3 -> -1; position 1 (group
    # 1): 3 - 2 = 1; position 4 (group 2): 1 - 0 (no 3); position 6 (group 5): 1 - 0 (no 4)
    assert train.signed_target(x).tolist() == [[-1, 1, 1, 1, 1, -1, 1]]
    roles = train.signed_roles(x)
    assert roles[0, 0].tolist() == [0, 1, 1, 1, 2, 0, 2]
    assert roles[0, 4].tolist() == [2, 2, 2, 2, 0, 2, 2]
    assert roles[0, 6].tolist() == [2, 2, 2, 2, 2, 2, 0]
    task = train.signed_task(7, 6)
    assert (task.vocab, task.causal) == (15, False)
    tokens, target = task.batch(5, torch.Generator().manual_seed(0), "train")
    assert tokens.shape == target.shape == (5, 7) and 0 <= tokens.min() <= tokens.max() < 6
    assert torch.equal(target, train.signed_target(tokens) + 7)
    assert target.min() >= 2 and target.max() <= 14  # the count in [2 - L, L], + L
    again, _ = task.batch(5, torch.Generator().manual_seed(0), "eval")
    assert torch.equal(tokens, again)  # the split does not change the draw
    with pytest.raises(ValueError, match="--groups 5: an even number"):
        train.signed_task(7, 5)


def test_every_function_starts_from_the_same_weights_gated_or_not():
    args = train.parse(TINY)
    task = train.signed_task(8, 4)
    base = train.build_model("sdpa", task, args).state_dict()
    for kind in train.KINDS:
        for gate in (False, True):
            state = train.build_model(kind, task, args, gate=gate).state_dict()
            shared = [name for name in base if name in state]
            assert shared == list(base)
            assert all(torch.equal(base[n], state[n]) for n in shared), kind
            extra = sorted(n for n in state if "gate" in n)
            assert len(extra) == (4 if gate else 0)  # W_g and b_g of each of two layers
            for n in extra:
                assert torch.equal(state[n], torch.full_like(
                    state[n], train.GATE_BIAS if n.endswith("gate_bias") else 0.0)), n


@pytest.mark.parametrize("kind", train.KINDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("gate", [False, True], ids=["ungated", "gated"])
def test_probed_weights_are_the_layers_own(kind, causal, gate):
    """weights() @ v (times the gate) is what the layer's attention returned: the probe
    recomputes the same function with the same (here moved) parameters."""
    torch.manual_seed(3)
    layer = train.Attention(16, 2, kind, causal, gate)
    with torch.no_grad():
        for p in layer.parameters():
            if p is not layer.qkv.weight and p is not layer.qkv.bias:
                p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(3, 7, 16)
    layer.keep = True
    with torch.no_grad():
        layer(x)
        q, k = layer.seen
        g = layer.seen_gate
        v = layer.qkv(x).chunk(3, -1)[2].view(3, 7, 2, -1).transpose(1, 2)
        got = layer.attend(q, k, v, g)
    assert (g is not None) == gate
    if gate:
        assert g.shape == (3, 2, 7, 8) and not torch.allclose(g, g[0, 0, 0, 0].expand_as(g))
    w = layer.weights()
    assert w.shape == (3, 2, 7, 7)
    if causal:
        assert torch.equal(w.triu(1), torch.zeros_like(w))
    want = w.float() @ v if g is None else (w.float() @ v) * g
    torch.testing.assert_close(want, got, rtol=1e-5, atol=1e-6)


def test_weight_stats_of_known_weights():
    # causal, 3 keys: uniform over what each query sees (query 0, one key, is left out)
    w = torch.tensor([[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]]).reshape(1, 1, 3, 3)
    s = train.weight_stats(w, causal=True)
    assert s["sink"] == pytest.approx((0.5 + 1 / 3) / 2)
    assert s["uniform_sink"] == pytest.approx((0.5 + 1 / 3) / 2)
    assert s["zero"] == 0 and s["empty"] == 0 and s["negative"] == 0
    assert s["entropy"] == pytest.approx(1) and s["total"] == pytest.approx(1)
    # no mask, 4 keys: one query all on key 0, one with half its weight on two keys,
    # one with nothing
    w = torch.tensor([[1.0, 0, 0, 0], [0, 0.25, 0.25, 0], [0, 0, 0, 0]]).reshape(1, 1, 3, 4)
    s = train.weight_stats(w, causal=False)
    assert s["sink"] == pytest.approx(1 / 3) and s["uniform_sink"] == pytest.approx(0.25)
    assert s["zero"] == pytest.approx((3 + 2 + 4) / 12)
    assert s["empty"] == pytest.approx(1 / 3)
    # entropy over the live queries: 0 and log 2 / log 4
    assert s["entropy"] == pytest.approx(0.25)
    assert s["total"] == pytest.approx(0.5) and s["total_min"] == 0
    # signed weights (cog's): the entropy of |w|, the total signed
    w = torch.tensor([[0.5, -0.5, 0, 0], [-0.25, -0.25, 0.25, 0.25]]).reshape(1, 1, 2, 4)
    s = train.weight_stats(w, causal=False)
    assert s["negative"] == pytest.approx(3 / 8) and s["zero"] == pytest.approx(2 / 8)
    assert s["entropy"] == pytest.approx((0.5 + 1) / 2)  # log 2 / log 4, then uniform
    assert s["total"] == pytest.approx(0) and s["total_min"] == 0
    assert s["sink"] == pytest.approx(0.125) and s["empty"] == 0
    w[0, 0, 0, 1] = math.nan  # a NaN weight is not filtered out
    assert math.isnan(train.weight_stats(w, causal=False)["total"])


def test_role_stats_and_the_strongest_head_by_hand():
    # 3 positions of groups 0, 1, 2 (0 and 1 paired): query 0's keys are own, paired, other
    roles = train.signed_roles(torch.tensor([[0, 1, 2]]))
    assert roles[0].tolist() == [[0, 1, 2], [1, 0, 2], [2, 2, 0]]
    signed = torch.tensor([[0.5, -0.5, 0.0], [-0.3, 0.6, 0.1], [0.2, 0.2, 0.6]])
    flat = torch.full((3, 3), 1 / 3)
    w = torch.stack([signed, flat])[None]  # (1, 2 heads, 3, 3)
    got = train.role_stats(w, roles)
    # own: every query has one (itself); paired: queries 0 and 1; other: all three
    assert got["same"] == pytest.approx([(0.5 + 0.6 + 0.6) / 3, 1 / 3])
    assert got["paired"] == pytest.approx([(-0.5 - 0.3) / 2, 1 / 3])
    # other: query 0 key 2 (0), query 1 key 2 (0.1), query 2 keys 0, 1 (mean 0.2)
    assert got["other"] == pytest.approx([(0 + 0.1 + 0.2) / 3, 1 / 3])
    evaluation = {"roles": {n: [v] for n, v in got.items()}}
    assert train.strongest_head(evaluation) == (0, 0)  # the flat head tells nothing apart
    assert train.strongest_head({"loss": 1.0}) is None


def test_stdlib_text_is_the_modules_source():
    text = train.stdlib_text(("textwrap",))
    assert text.startswith('"""Text wrapping and filling.')
    ids = train.encode("a\n\t~")
    assert ids.tolist() == [ord("a") - 31, 0, 96, 95]


@pytest.mark.parametrize("argv, message", [
    (["--attention", "sdpa,softmax2"], "argument --attention: 'sdpa,softmax2': give distinct"),
    (["--attention", "sdpa,sdpa"], "argument --attention: 'sdpa,sdpa': give distinct"),
    (["--task", "copy"], "argument --task: 'copy': give distinct tasks"),
    (["--steps", "5", "--warmup", "5"], "--steps must exceed --warmup (5)"),
    (["--d-model", "30", "--heads", "4"], "--d-model 30 is not a multiple of --heads 4"),
    (["--task", "signed", "--heads", "1,3"], "--d-model 64 is not a multiple of --heads 3"),
    (["--heads", "2,2"], "argument --heads: '2,2': give distinct counts"),
    (["--heads", "0"], "argument --heads: '0': give distinct counts"),
    (["--gate", "maybe"], "argument --gate: invalid choice: 'maybe'"),
    (["--task", "signed", "--groups", "5"], "--groups 5: give an even number from 2 to 33"),
    (["--jobs", "0"], "--jobs must be at least 1"),
    (["--from-json", "/nonexistent/run.json"], "--from-json /nonexistent/run.json: "),
])
def test_bad_option_is_one_line_and_exit_2(argv, message, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        train.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_runs_with_bf16_autocast_on_cpu(capsys):
    _main(["--attention", "sdpa,elastic", "--task", "reverse", "--steps", "2", "--warmup", "1",
           "--length", "6", "--batch", "2", "--eval-batch", "2", "--d-model", "16", "--heads",
           "2", "--layers", "1", "--dtype", "bf16"])
    lines = [line.split() for line in capsys.readouterr().out.splitlines()
             if " step " in line]
    assert [line[:3] for line in lines] == [["sdpa", "step", "2"], ["elastic", "step", "2"]]
    assert all(math.isfinite(float(line[line.index("loss") + 1])) for line in lines)
