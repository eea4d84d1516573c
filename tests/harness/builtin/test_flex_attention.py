"""The FlexAttention composition as an attention kernel (elasticbench/harness/builtin/flex_attention.py) and SDPA
pinned to one backend (elasticbench/harness/builtin/sdpa_kernels.py), on the CPU: values against the eager
composite, the special values, the gradients through FlexAttention's eager dense backward,
and the refusals (docs/attention.md sections 3, 4 and 6)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elasticbench import settings
from elasticbench.attention.composite import elastic_attention_composite
from elasticbench.harness.backends import FLEX_CPU_BACKWARD_ENV, get_backend
from elasticbench.harness.registry import get_kernel

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _inputs(batch=2, heads=2, lq=9, lk=7, dim=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, dim, generator=g, dtype=torch.float64)
               for n in (lq, lk, lk))
    tau = torch.tensor([[0.5, 2.0], [1.0, 0.25]], dtype=torch.float64)[:batch, :heads]
    beta = torch.tensor([[0.0, 1.0], [3.0, 0.0]], dtype=torch.float64)[:batch, :heads]
    key_mask = torch.ones(batch, lk, dtype=torch.bool)
    key_mask[0, 4:] = False
    key_mask[-1, :] = False  # a batch with no key at all
    return q, k, v, tau, beta, key_mask


def _reference(q, k, v, tau, beta, scale, causal, key_mask=None):
    mask = None if key_mask is None else key_mask[:, None, None, :]
    return elastic_attention_composite(q, k, v, tau=tau[:, :, None, None],
                                       beta=beta[:, :, None, None], scale=scale,
                                       causal=causal, attn_mask=mask)


def _flex(q, k, v, tau, beta, scale, causal, key_mask=None):
    kw = {} if key_mask is None else {"key_mask": key_mask}
    return get_kernel("flex_attention").fn(q, k, v, tau=tau, beta=beta, scale=scale,
                                           causal=causal, **kw)


# FlexAttention's first eager call in a process costs seconds (torch imports its
# compiler's machinery): every test that calls it is marked ci
@pytest.mark.ci
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_forward_is_the_composite(causal, padded):
    q, k, v, tau, beta, key_mask = _inputs()
    mask = key_mask if padded else None
    got = _flex(q, k, v, tau, beta, 0.7, causal, mask)
    want = _reference(q, k, v, tau, beta, 0.7, causal, mask)
    assert got.dtype == q.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    if padded:  # the batch with no key gives exactly 0, whatever beta
        assert torch.equal(got[-1], torch.zeros_like(got[-1]))


@pytest.mark.ci
def test_special_values_follow_the_policy():
    q, k, v, tau, beta, _ = _inputs(batch=1)
    q[0, 0, 3, 0] = math.nan  # query 3 of head 0: NaN
    k[0, 1, 2, :] = math.inf  # key 2 of head 1: +inf scores where q . 1 > 0
    v[0, 0, 5, :] = math.nan  # key 5 of head 0's values
    q[0, 0, 1] = -k[0, 0].sum(0)  # query 1 of head 0: probably keeps little
    q[0, 0, 0] = 0.0  # scores exactly 0: kept, every weight equal
    for causal in (False, True):
        got = _flex(q, k, v, tau, beta, 0.5, causal)
        want = _reference(q, k, v, tau, beta, 0.5, causal)
        assert torch.equal(got.isnan(), want.isnan()), causal
        torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=1e-12, atol=0)
    # an all-negative query with beta = 0 gives exactly 0 (lse = -inf, ln 0 = -inf: no NaN)
    q, k, v, tau, beta, _ = _inputs(batch=1, heads=1)
    q, k = q.abs(), -k.abs()  # every score negative: no query keeps a key
    v[0, 0, 2] = math.nan
    got = _flex(q, k, v, tau, torch.zeros_like(beta), 0.5, False)
    assert torch.equal(got, torch.zeros_like(got))


@pytest.fixture(autouse=True)
def _settings_read_again(monkeypatch):
    """The settings read again after a test that changed the environment, once restored."""
    yield
    monkeypatch.undo()
    settings.refresh()


def _setenv(monkeypatch, name: str, value: str) -> None:
    """Set the variable and read the settings again, as a process started with it would."""
    monkeypatch.setenv(name, value)
    settings.refresh()


def test_the_backward_declines_cpu_tensors_in_one_line(monkeypatch):
    monkeypatch.delenv(FLEX_CPU_BACKWARD_ENV, raising=False)
    settings.refresh()
    q, k, v, tau, beta, _ = _inputs()
    with pytest.raises(NotImplementedError, match=r"no backward on the CPU.*CUDA") as e:
        get_kernel("flex_attention", "bwd").fn(q, k, v, tau=tau, beta=beta, scale=0.5,
                                               causal=True)
    assert "\n" not in str(e.value) and FLEX_CPU_BACKWARD_ENV in str(e.value)


def _grads(fn, q, k, v, tau, beta, dout, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, tau, beta)]
    out = fn(*leaves, **kw)
    return torch.autograd.grad(out, leaves, dout)


@pytest.mark.ci
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_through_the_dense_backward(monkeypatch, causal):
    _setenv(monkeypatch, FLEX_CPU_BACKWARD_ENV, "1")
    q, k, v, tau, beta, key_mask = _inputs()
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), dtype=q.dtype)
    step = get_kernel("flex_attention", "bwd").fn(q, k, v, tau=tau, beta=beta, scale=0.5,
                                                  causal=causal, key_mask=key_mask)
    got = step(dout)
    want = _grads(lambda q, k, v, t, b: _reference(q, k, v, t, b, 0.5, causal, key_mask),
                  q, k, v, tau, beta, dout)
    for name, a, b in zip(("dq", "dk", "dv", "dtau", "dbeta"), got, want, strict=True):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    # beta = 0 (batch 0 head 0) has a finite gradient, and the batch with no key gets zeros
    assert torch.isfinite(got[4]).all() and got[4][0, 0] != 0
    assert torch.equal(got[0][-1], torch.zeros_like(got[0][-1]))
    # the second call of step gives the same (the graph is kept)
    assert torch.equal(step(dout)[3], got[3])


@pytest.mark.ci
def test_a_nan_query_poisons_only_what_it_sees(monkeypatch):
    _setenv(monkeypatch, FLEX_CPU_BACKWARD_ENV, "1")
    q, k, v, tau, beta, _ = _inputs(batch=1)
    q[0, 1, 2, 1] = math.nan
    dout = torch.ones(q.shape, dtype=q.dtype)
    got = get_kernel("flex_attention", "bwd").fn(q, k, v, tau=tau, beta=beta, scale=0.5,
                                                 causal=True)(dout)
    want = _grads(lambda q, k, v, t, b: _reference(q, k, v, t, b, 0.5, True),
                  q, k, v, tau, beta, dout)
    for name, a, b in zip(("dq", "dk", "dv", "dtau", "dbeta"), got, want, strict=True):
        assert torch.equal(a.isnan(), b.isnan()), name
        torch.testing.assert_close(a.nan_to_num(), b.nan_to_num(), rtol=1e-10, atol=1e-12,
                                   msg=name)
    assert not got[0][0, 0].isnan().any()  # head 0 untouched


@pytest.mark.ci
def test_block_masks_are_reused_until_the_mask_changes():
    from elasticbench.harness.builtin import flex_attention as flex

    q, k, _, _, _, key_mask = _inputs()
    first = flex.block_mask_for(q, k, True, key_mask)
    assert flex.block_mask_for(q, k, True, key_mask) is first
    assert flex.block_mask_for(q, k, False, key_mask) is not first
    assert flex.block_mask_for(q, k, False, None) is None
    key_mask[0, 0] = False  # written in place: its version moves, the mask is rebuilt
    assert flex.block_mask_for(q, k, True, key_mask) is not first
    with pytest.raises(ValueError, match="key_mask must be"):
        flex.block_mask_for(q, k, True, key_mask[:, :3])


def test_the_backend_follows_the_torch_device(monkeypatch):
    backend = get_backend("flex_attention")
    assert backend.unavailable() is None and backend.compiles and backend.autograd
    _setenv(monkeypatch, "ELASTICBENCH_TORCH_DEVICE", "cuda")
    assert backend.device() == "cuda"
    _setenv(monkeypatch, FLEX_CPU_BACKWARD_ENV, "1")
    assert backend.environment()[FLEX_CPU_BACKWARD_ENV] == "1"
    spec = get_kernel("flex_attention")
    assert spec.baseline and spec.function == "elastic_attention"


def test_sdpa_pinned_to_a_backend():
    q, k, v, *_ = _inputs(lq=7)
    q, k, v = (t.float() for t in (q, k, v))
    want = get_kernel("sdpa").fn(q, k, v, scale=0.5, causal=True)
    got = get_kernel("sdpa_flash").fn(q, k, v, scale=0.5, causal=True)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="cuDNN backend runs on CUDA tensors only"):
        get_kernel("sdpa_cudnn").fn(q, k, v, scale=0.5, causal=False)
    grads = get_kernel("sdpa_flash", "bwd").fn(q, k, v, scale=0.5, causal=False)(
        torch.ones_like(q))
    assert len(grads) == 3 and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.ci
def test_verify_passes_the_quick_matrix_forward_and_backward():
    env = {**os.environ, FLEX_CPU_BACKWARD_ENV: "1"}
    run = subprocess.run([sys.executable, "-m", "elasticbench", "verify", "--only",
                          "flex_attention", "--quick", "--mode", "both"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "96 cases, 96 passed, 0 failed" in run.stdout + run.stderr


@pytest.mark.ci
def test_the_gpu_attention_cases_load_and_plan():
    """Under Triton's interpreter (so that triton_attention is registered) the GPU cases load
    and plan: every kernel in every cell, flash SDPA left out of the padded ones; without it
    `run` stops in one line that says Triton needs a CUDA GPU (exit 2)."""
    script = (
        "import json\n"
        "from pathlib import Path\n"
        "from elasticbench.harness.kinds.attention.run_job import AttentionRunJob\n"
        "from elasticbench.harness.kinds.attention.run_case import load_attention_run\n"
        "out = {}\n"
        "for name in ('attention-gpu', 'attention-gpu-d64', 'attention-gpu-headline'):\n"
        "    job = AttentionRunJob(load_attention_run(Path('cases') / f'{name}.toml'), 'cuda')\n"
        "    units = job.plan()\n"
        "    out[name] = [len(units), sorted({u.spec.name for u in units}), job.skipped,\n"
        "                 job.case.head_dim]\n"
        "print(json.dumps(out))\n")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    plans = json.loads(run.stdout.splitlines()[-1])
    kernels = ["flex_attention", "sdpa", "sdpa_cudnn", "sdpa_flash", "triton_attention"]
    # 2 modes x 2 dtypes x 4 lengths x (causal, padded) 4 x 5 kernels, less flash's masked 32
    assert plans["attention-gpu"][:2] == [288, kernels] and plans["attention-gpu"][3] == 128
    assert plans["attention-gpu-d64"][:2] == [288, kernels]
    assert plans["attention-gpu-d64"][3] == 64
    assert plans["attention-gpu-headline"][:3] == [20, kernels, []]
    assert all("sdpa_flash" in s for s in plans["attention-gpu"][2])
    env.pop("TRITON_INTERPRET")
    run = subprocess.run([sys.executable, "-m", "elasticbench", "run", "--case",
                          "cases/attention-gpu.toml"], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "Triton needs a CUDA GPU" in run.stderr


@pytest.mark.needs("gpu")
@pytest.mark.parametrize("causal", [False, True])
def test_the_compiled_cuda_composition_is_the_composite(causal):
    """On CUDA (torch.compile'd FlexAttention): fp32 forward and the five gradients against
    the composite, key padding, beta = 0 and a NaN query included (scripts/gpu_checks.sh)."""
    q, k, v, tau, beta, key_mask = (t.cuda() for t in _inputs(lq=130, lk=150, dim=16))
    q[0, 1, 5, 0] = math.nan
    q, k, v, tau, beta = (t.float() for t in (q, k, v, tau, beta))
    got = _flex(q, k, v, tau, beta, 0.25, causal, key_mask)
    want = _reference(q, k, v, tau, beta, 0.25, causal, key_mask)
    assert torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=1e-4, atol=1e-5)
    dout = torch.randn(q.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    grads = get_kernel("flex_attention", "bwd").fn(q, k, v, tau=tau, beta=beta, scale=0.25,
                                                   causal=causal, key_mask=key_mask)(dout)
    ref = _grads(lambda q, k, v, t, b: _reference(q, k, v, t, b, 0.25, causal, key_mask),
                 q, k, v, tau, beta, dout)
    for name, a, b in zip(("dq", "dk", "dv", "dtau", "dbeta"), grads, ref, strict=True):
        assert torch.equal(a.isnan(), b.isnan()), name
        torch.testing.assert_close(a.nan_to_num(), b.nan_to_num(), rtol=2e-3, atol=1e-4,
                                   msg=name)
