"""The family's modules under torch.distributed (docs/distributed.md): examples/distributed.py
run by torchrun as two CPU processes (gloo), under DDP and FSDP2. Its gradients of every
parameter (tau, beta and eta included) are one process's on the combined batch, and its
checkpoints (torch.distributed.checkpoint) load back bit for bit."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "distributed.py"
WRAPPERS = ("ddp", "fsdp")
# fp32 rounding: per parameter, the largest difference within 2e-6 of that parameter's
# largest gradient (about 17 fp32 units in the last place at it). The two processes sum
# their halves of each batch reduction and then each other's (gloo's all-reduce, FSDP2's
# reduce-scatter) where one process sums the whole batch at once; measured on a 2-core CPU:
# 4.3e-7 at most (a linear layer's weight), 6.2e-8 for tau, beta and eta.
RELATIVE = 2e-6
FAMILY = ("log_tau_scale", "log_beta_scale", "log_eta_scale")

pytestmark = pytest.mark.skipif(not torch.distributed.is_available()
                                or not torch.distributed.is_gloo_available(),
                                reason="this torch has no torch.distributed with gloo")


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("distributed_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """Two processes, both wrappers, three steps, a checkpoint: (the JSON, the dump)."""
    tmp = tmp_path_factory.mktemp("distributed")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", str(EXAMPLE), "--steps", "3", "--warmup", "1", "--threads", "1",
           "--batch", "4", "--length", "12", "--checkpoint", str(tmp / "checkpoint"),
           "--json", str(tmp / "out.json"), "--dump", str(tmp / "dump.pt")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp / "out.json").read_text())
    return report, torch.load(tmp / "dump.pt", weights_only=False)


@pytest.mark.ci
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_gradients_are_one_process_s_on_the_combined_batch(launched, wrapper):
    report, dump = launched
    assert report["world_size"] == 2 and report["backend"] == "gloo"
    ex = example()
    cfg = ex.Config(**dump["config"])
    model = ex.build("family", cfg, dump["seed"])
    x, y = ex.global_batch(cfg, dump["world"], dump["seed"], 0)
    ex.loss_of(model, x, y).backward()
    got = dump[f"{wrapper}/family/gradients"]
    want = {n: p.grad for n, p in model.named_parameters()}
    assert sorted(got) == sorted(want)
    family = [n for n in want if n.rsplit(".", 1)[-1] in FAMILY]
    assert len(family) == 5  # tau, beta per head; tau, beta of ElasticSoftmax; eta per head
    for name, g in want.items():
        assert got[name].shape == g.shape, name
        scale = g.abs().max().item()
        assert scale > 0, name  # every parameter learns, so the comparison says something
        worst = (got[name] - g).abs().max().item()
        assert worst <= RELATIVE * scale, (name, worst, scale)


@pytest.mark.ci
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_checkpoint_loads_back_bit_for_bit(launched, wrapper):
    """In the two processes: the loaded parameters and the next step (its loss and the
    parameters after it) are the saved model's. Here, in one process without a process
    group: the checkpoint's shards load into a plain model as the parameters saved."""
    import torch.distributed.checkpoint as dcp

    report, dump = launched
    for attention in ("family", "sdpa"):
        verdict = report["runs"][wrapper]["checkpoint"][attention]
        assert verdict["parameters_identical"] and verdict["next_step_parameters_identical"]
        loss_a, loss_b = verdict["next_loss"]
        assert loss_a == loss_b and 0 < loss_a < 10
    ex = example()
    plain = ex.build("family", ex.Config(**dump["config"]), dump["seed"] + 7)
    state = {"model": plain.state_dict()}
    dcp.load(state, checkpoint_id=dump[f"{wrapper}/family/checkpoint"], no_dist=True)
    plain.load_state_dict(state["model"])
    saved = dump[f"{wrapper}/family/parameters"]
    assert sorted(saved) == sorted(n for n, _ in plain.named_parameters())
    for name, p in plain.named_parameters():
        assert torch.equal(p.detach(), saved[name]), name
    assert plain.layers[1].attention.inner.log_tau_scale.shape == (1,)


@pytest.mark.ci
def test_both_wrappers_train_the_same_model_the_same_way(launched):
    """DDP and FSDP2 see the same global batches from the same weights: their losses agree
    to rounding, and the step times are reported (a benchmark, not asserted)."""
    report, _ = launched
    ddp, fsdp = (report["runs"][w]["family"] for w in WRAPPERS)
    assert len(ddp["losses"]) == len(fsdp["losses"]) == 3
    for a, b in zip(ddp["losses"], fsdp["losses"], strict=True):
        assert abs(a - b) <= 1e-5 * abs(a)
    for w in WRAPPERS:
        assert report["runs"][w]["ratio_family_over_sdpa"] > 0


@pytest.mark.ci
def test_outside_torchrun_it_says_so_in_one_line():
    """Two interpreters that import torch: about 10 s on a busy 2-core CPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "2"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "torchrun" in done.stderr
    bad = subprocess.run([sys.executable, str(EXAMPLE), "--wrapper", "fsdp1"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "ddp, fsdp" in bad.stderr
