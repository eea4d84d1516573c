"""examples/train.py's comparison of the attention family: a few steps of every function on
both tasks (in this process, tiny sizes, about a second), the probes' statistics on weights
whose values are known, and the probes' weights against what each layer computes."""

from __future__ import annotations

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
        "--layers", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("train_example")
    threads = torch.get_num_threads()
    try:
        train.main([*TINY, "--json", str(out / "run.json"), "--table", str(out / "table.md")])
    finally:
        torch.set_num_threads(threads)
    return json.loads((out / "run.json").read_text()), (out / "table.md").read_text()


def test_every_function_trains_on_both_tasks_with_its_probes_in_range(tiny):
    doc, _ = tiny
    runs = {(r["task"], r["attention"]): r for r in doc["runs"]}
    assert list(runs) == [(t, k) for t in ("chars", "reverse") for k in train.KINDS]
    for (task, kind), r in runs.items():
        assert len(r["train_loss"]) == 3 and all(math.isfinite(v) for v in r["train_loss"])
        assert r["timed_steps"] == 2  # the warm-up step is trained, not timed
        assert math.isfinite(r["ms_per_step"]) and r["ms_per_step"] > 0
        assert (r["implementation"] == "torch sdpa") == (kind == "sdpa"), r["implementation"]
        assert math.isfinite(r["cpu_ms_per_step"]) and r["cpu_ms_per_step"] > 0
        assert [e["step"] for e in r["evals"]] == [0, 1, 2, 3]
        for e in r["evals"]:
            assert math.isfinite(e["loss"]) and 0 <= e["acc"] <= 1, (task, kind, e)
            assert 0 <= e["sink"] <= 1 and 0 <= e["zero"] <= 1 and 0 <= e["empty"] <= 1
            assert 0 <= e["entropy"] <= 1 + 1e-9, (task, kind, e)
            assert 0 <= e["total_min"] <= e["total"]
            if kind in ("sdpa", "stablemax"):  # normalized, no offset: every query sums to 1
                assert e["total"] == pytest.approx(1, abs=1e-6)
                assert e["total_min"] == pytest.approx(1, abs=1e-6)
            elif kind == "sigmoid":  # each weight in (0, 1): a total up to the keys seen
                assert 0 < e["total"] < 8
            else:  # an offset in the denominator: strictly below 1 per query
                assert e["total"] < 1, (task, kind, e)
            if kind in ("stablemax", "sigmoid"):  # no weight of these is 0 at these scores
                assert e["zero"] == 0
        # the uniform baseline: 1/8 without a mask; causal, the mean of 1/(i+1), i = 1..7
        uniform = 1 / 8 if task == "reverse" else sum(1 / n for n in range(2, 9)) / 7
        assert r["evals"][0]["uniform_sink"] == pytest.approx(uniform)


def test_learned_parameters_are_reported_per_head_and_move(tiny):
    doc, _ = tiny
    runs = {(r["task"], r["attention"]): r for r in doc["runs"]}
    for (_, kind), r in runs.items():
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
    for task in ("chars", "reverse"):
        assert f"**{task}** (3 steps;" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| attention")]
    assert [row.split("|")[1].strip() for row in rows] == list(train.KINDS) * 2
    for row, r in zip(rows, doc["runs"], strict=True):
        assert f"| {r['evals'][-1]['loss']:.3f} |" in row


@pytest.mark.ci  # matplotlib's import and a 16-panel render: seconds of a core, for no value
def test_figure_is_written(tiny, tmp_path):
    pytest.importorskip("matplotlib")
    doc, _ = tiny
    train.plot(doc["runs"], str(tmp_path / "fig.png"))
    head = (tmp_path / "fig.png").read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n"


def test_every_function_starts_from_the_same_weights():
    args = train.parse(TINY)
    task = train.reverse_task(8, 10)
    base = train.build_model("sdpa", task, args).state_dict()
    for kind in train.KINDS[1:]:
        state = train.build_model(kind, task, args).state_dict()
        shared = [name for name in base if name in state]
        assert shared == list(base)
        assert all(torch.equal(base[n], state[n]) for n in shared), kind


@pytest.mark.parametrize("kind", train.KINDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_probed_weights_are_the_layers_own(kind, causal):
    """weights() @ v is what the layer's attention returned: the probe recomputes the same
    function with the same (here moved) parameters."""
    torch.manual_seed(3)
    layer = train.Attention(16, 2, kind, causal)
    with torch.no_grad():
        for p in (layer.fn.parameters() if layer.fn is not None else ()):
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(3, 7, 16)
    layer.keep = True
    got = {}

    def hook(module, args, out):
        got["out"] = out

    handle = (layer.fn.register_forward_hook(hook) if layer.fn is not None else None)
    with torch.no_grad():
        layer(x)
    q, k = layer.seen
    v = layer.qkv(x).chunk(3, -1)[2].view(3, 7, 2, -1).transpose(1, 2)
    if handle is None:
        got["out"] = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        handle.remove()
    w = layer.weights()
    assert w.shape == (3, 2, 7, 7)
    if causal:
        assert torch.equal(w.triu(1), torch.zeros_like(w))
    torch.testing.assert_close(w.float() @ v, got["out"], rtol=1e-5, atol=1e-6)


def test_weight_stats_of_known_weights():
    # causal, 3 keys: uniform over what each query sees (query 0, one key, is left out)
    w = torch.tensor([[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]]).reshape(1, 1, 3, 3)
    s = train.weight_stats(w, causal=True)
    assert s["sink"] == pytest.approx((0.5 + 1 / 3) / 2)
    assert s["uniform_sink"] == pytest.approx((0.5 + 1 / 3) / 2)
    assert s["zero"] == 0 and s["empty"] == 0
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
    w[0, 0, 0, 1] = math.nan  # a NaN weight is not filtered out
    assert math.isnan(train.weight_stats(w, causal=False)["total"])


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
])
def test_bad_option_is_one_line_and_exit_2(argv, message, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        train.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_runs_with_bf16_autocast_on_cpu(capsys):
    threads = torch.get_num_threads()
    try:
        train.main(["--attention", "sdpa,elastic", "--task", "reverse", "--steps", "2",
                    "--warmup", "1", "--length", "6", "--batch", "2", "--eval-batch", "2",
                    "--d-model", "16", "--heads", "2", "--layers", "1", "--dtype", "bf16"])
    finally:
        torch.set_num_threads(threads)
    lines = [line.split() for line in capsys.readouterr().out.splitlines()
             if " step " in line]
    assert [line[:3] for line in lines] == [["sdpa", "step", "2"], ["elastic", "step", "2"]]
    assert all(math.isfinite(float(line[line.index("loss") + 1])) for line in lines)
