"""scripts/gpu_user_path.py on this machine's CPU at its --quick sizes: the native CPU path (no
Triton interpreter, no forced implementation), so the raw Triton kernels are skipped with
their reason and the public API's times are the native kernels'. Nothing here asserts on a
time beyond its being finite and positive. On a GPU, scripts/gpu_checks.sh runs the script
at full size."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elasticbench import devices

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_user_path.py"


def _run(tmp: Path, *only: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, dict]:
    """The script with --device cpu --quick, the sections `only`, in a child whose environment
    asks for the preference (the native CPU path): its process and its JSON."""
    env = devices.interpreter_env(on=False)
    env.pop("ELASTICBENCH_IMPLEMENTATION", None)
    out = tmp / "user_path.json"
    child = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--json",
                            str(out), "--only", ",".join(only)], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=timeout)
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-4000:]
    return child, json.loads(out.read_text())


def _positive(ms) -> bool:
    return isinstance(ms, float) and math.isfinite(ms) and ms > 0


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    return _run(tmp_path_factory.mktemp("user_path"), "sync", "graph", "rows", "attention")


@pytest.mark.ci  # the script in a child process: CI, not make test's 5 minutes
def test_sync_and_graph_say_skipped_on_the_cpu(quick):
    _, doc = quick
    for name in ("sync", "graph"):
        assert doc["sections"][name]["status"] == "skipped"
        assert doc["sections"][name]["reason"] == "cuda only"
    # the model is bf16 (the attention table's path on a GPU), and sync still ran its eager
    # step here, recording what it launched (the native CPU kernels note nothing)
    sync = doc["sections"]["sync"]
    assert doc["model_dtype"] == "bf16" and sync["dtype"] == "bf16"
    assert math.isfinite(sync["eager_loss"]) and isinstance(sync["launches"], list)


@pytest.mark.ci  # the script in a child process: CI, not make test's 5 minutes
def test_run_records_its_device_versions_and_options(quick):
    import torch

    child, doc = quick
    assert doc["device_type"] == "cpu" and doc["quick"] is True
    assert doc["torch"] == torch.__version__
    assert doc["timer"].startswith("perf_counter median")
    assert doc["environment"] == {"ELASTICBENCH_IMPLEMENTATION": None, "TRITON_INTERPRET": None}
    assert list(doc["sections"]) == ["sync", "graph", "rows", "attention"]
    assert doc["commit"] is None or len(doc["commit"]) == 40
    # a table per section, printed
    for title in ("sync: skipped", "graph: skipped", "rows (64x256)", "attention (B=1 H=2"):
        assert title in child.stdout, child.stdout


@pytest.mark.ci  # the script in a child process: CI, not make test's 5 minutes
def test_rows_time_the_public_api_and_skip_the_raw_kernels_with_a_reason(quick):
    _, doc = quick
    rows = doc["sections"]["rows"]
    assert rows["status"] == "ok" and rows["shape"] == [64, 256]
    entries = {(e["dtype"], e["impl"], e["pass"]): e for e in rows["entries"]}
    assert len(entries) == len(rows["entries"]) == 2 * 4 * 3
    for dtype in ("fp32", "bf16"):
        for p in ("fwd", "bwd", "fwd+bwd"):
            for impl in ("public", "module", "torch.softmax"):
                e = entries[(dtype, impl, p)]
                assert e["status"] == "ok" and _positive(e["ms"]), e
            raw = entries[(dtype, "raw", p)]
            assert raw["status"] == "skipped" and raw["ms"] is None
            assert "TRITON_INTERPRET=1" in raw["reason"]
    # the native C++ kernels, where they build here; the torch code otherwise
    assert set(rows["public_implementation"].values()) <= {"cpp", "torch"}
    ratios = {(r["dtype"], r["ratio"], r["pass"]): r["value"] for r in rows["ratios"]}
    for dtype in ("fp32", "bf16"):
        for p in ("fwd", "bwd", "fwd+bwd"):
            assert ratios[(dtype, "public/torch.softmax", p)] == pytest.approx(
                entries[(dtype, "public", p)]["ms"] / entries[(dtype, "torch.softmax", p)]["ms"])
            assert ratios[(dtype, "public/raw", p)] is None  # no raw time to divide by


@pytest.mark.ci  # the script in a child process: CI, not make test's 5 minutes
def test_attention_times_the_public_api_module_and_sdpa(quick):
    _, doc = quick
    att = doc["sections"]["attention"]
    assert att["status"] == "ok"
    assert (att["batch"], att["heads"], att["dim"], att["lengths"]) == (1, 2, 16, [64])
    entries = {(e["causal"], e["impl"], e["pass"]): e for e in att["entries"]}
    assert len(entries) == len(att["entries"]) == 2 * 4 * 3
    for causal in (False, True):
        for p in ("fwd", "bwd", "fwd+bwd"):
            for impl in ("public", "module", "sdpa"):
                e = entries[(causal, impl, p)]
                assert e["status"] == "ok" and _positive(e["ms"]), e
                # TFLOP/s: 4 B H L^2 D forward, 2.5 times that backward, halved when causal
                flops = 4 * 1 * 2 * 64 * 64 * 16 * {"fwd": 1, "bwd": 2.5, "fwd+bwd": 3.5}[p]
                flops /= 2 if causal else 1
                assert e["tflops"] == pytest.approx(flops / (e["ms"] * 1e-3) / 1e12)
            direct = entries[(causal, "direct", p)]
            assert direct["status"] == "skipped" and "TRITON_INTERPRET=1" in direct["reason"]
    ratios = {(r["causal"], r["ratio"], r["pass"]): r["value"] for r in att["ratios"]}
    assert ratios[(True, "public/sdpa", "fwd")] == pytest.approx(
        entries[(True, "public", "fwd")]["ms"] / entries[(True, "sdpa", "fwd")]["ms"])


# torch.compile's first call compiles the model's forward and backward with Inductor: ~5 s
# with Inductor's cache warm, ~30 s cold on the project's 2-core machine
@pytest.mark.ci
def test_compile_section_runs_fullgraph_on_the_cpu(tmp_path):
    _, doc = _run(tmp_path, "compile")
    c = doc["sections"]["compile"]
    assert c["status"] == "passed", c
    assert c["graph_breaks"] == 0 and c["graphs"] == 1
    # Inductor fuses and reorders fp32 arithmetic: equal to rounding, not bit for bit
    assert c["loss_rel_difference"] < 1e-5 and c["grads_max_rel_difference"] < 1e-4


def _script():
    spec = importlib.util.spec_from_file_location("gpu_user_path", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bad_section_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        _script().parse(["--device", "cpu", "--only", "rows,bogus"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "choose from sync" in err


@pytest.mark.needs("no_gpu")
def test_cuda_asked_without_one_says_so_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        _script().parse([])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "no CUDA device" in err


def test_a_failing_section_is_recorded_in_one_line_and_the_others_run(tmp_path, monkeypatch):
    script = _script()

    def broken(run, out):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setitem(script.RUNNERS, "rows", broken)
    monkeypatch.setattr(script.torch, "set_num_threads", lambda n: None)  # leave ours alone
    out = tmp_path / "doc.json"
    code = script.main(["--device", "cpu", "--quick", "--only", "rows,graph", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert code == 1
    assert doc["sections"]["rows"]["status"] == "failed"
    assert doc["sections"]["rows"]["reason"] == "RuntimeError: boom"
    assert doc["sections"]["graph"]["status"] == "skipped"
    assert os.path.exists(out) and not os.path.exists(f"{out}.tmp")
