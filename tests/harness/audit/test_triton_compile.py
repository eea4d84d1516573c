"""Kernel files' Triton kernels compiled for sm_90/sm_80 on this GPU-less machine.

The interpreter accepts code the compiler rejects; elasticbench.harness.audit.kernel_files compiles
what a wrapper launches (captured, never run) and reports registers and spills, or the
compiler's message. Compiling needs no interpreter, so these run in the ordinary process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

import torch
import triton
import triton.language as tl

from elasticbench import devices
from elasticbench.harness.audit.capture import capture_launches
from elasticbench.harness.audit.kernel_files import (
    CallRequest,
    CompileCache,
    check_call,
    check_calls,
)
from elasticbench.harness.registry import get_kernel, load_kernel_file

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
INTERPRETER_ONLY = FIXTURES / "triton_interpreter_only.py"
BF16 = FIXTURES / "triton_bf16.py"

pytestmark = pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")


def test_a_kernel_only_the_interpreter_accepts_does_not_compile(tmp_path) -> None:
    load_kernel_file(INTERPRETER_ONLY)
    fn = get_kernel("interpreter_only_softmax").fn
    cache = CompileCache(tmp_path)
    check = check_call(fn, CallRequest("interpreter_only_softmax", "fwd", "fp32", (4, 100)),
                       cache)
    assert check.compiles is False and check.error is None
    assert [(c.launch, c.arch) for c in check.launches] == [("softmax_exp2_kernel", 90),
                                                           ("softmax_exp2_kernel", 80)]
    failure = check.failure()
    where = INTERPRETER_ONLY.relative_to(Path.cwd()) if INTERPRETER_ONLY.is_relative_to(
        Path.cwd()) else INTERPRETER_ONLY
    assert failure.startswith(f"does not compile for sm_90: {where}:23: NameError")
    assert "global variable LOG2E" in failure
    # the same specialization again: from the cache, in memory and on disk
    again = check_call(fn, CallRequest("interpreter_only_softmax", "fwd", "fp32", (4, 100)),
                       cache)
    fresh = CompileCache(tmp_path)
    from_disk = check_call(fn, CallRequest("interpreter_only_softmax", "fwd", "fp32", (4, 100)),
                           fresh)
    assert cache.compiled == 2 and fresh.compiled == 0
    assert again.launches == check.launches == from_disk.launches


def test_third_party_kernels_compile_with_registers_and_no_spills(tmp_path) -> None:
    load_kernel_file(BF16)
    cache = CompileCache(tmp_path)
    for mode in ("fwd", "bwd"):
        check = check_call(get_kernel("thirdparty_softmax", mode).fn,
                           CallRequest("thirdparty_softmax", mode, "bf16", (2, 33)), cache)
        assert check.compiles is True and check.failure() is None
        assert {c.arch for c in check.launches} == {90, 80}
        for c in check.launches:
            assert 8 <= c.regs <= 255 and c.spill_bytes == 0
    # shapes that specialize alike compile once: BLOCK 64 and n % 16 != 0 both times
    before = cache.compiled
    check_call(get_kernel("thirdparty_softmax").fn,
               CallRequest("thirdparty_softmax", "fwd", "bf16", (5, 35)), cache)
    assert cache.compiled == before


def test_a_wrapper_that_needs_a_gpu_is_not_a_compile_failure(tmp_path) -> None:
    def needs_cuda(x):
        raise RuntimeError("expected a CUDA tensor")

    check = check_call(needs_cuda, CallRequest("k", "fwd", "fp32", (2, 8)), CompileCache(None))
    assert check.compiles is None and check.failure() is None
    assert check.error == ("could not be driven on CPU tensors: RuntimeError: "
                           "expected a CUDA tensor")


@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=1),
                          triton.Config({"BLOCK": 32}, num_warps=2)], key=["n"])
@triton.jit
def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_capture_records_every_autotune_config_and_runs_nothing() -> None:
    x = torch.ones(40)
    with capture_launches() as launches:
        _scale_kernel[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, 40)
    assert [(la.kwargs["BLOCK"], la.num_warps) for la in launches] == [(16, 1), (32, 2)]
    assert all(la.name == "_scale_kernel" and la.args == (x, 40) for la in launches)
    assert torch.equal(x, torch.ones(40))


def test_the_check_runs_without_the_interpreter_even_when_called_under_it(monkeypatch) -> None:
    monkeypatch.setenv(devices.INTERPRET_ENV, "1")  # as in `TRITON_INTERPRET=1 elasticbench verify`
    requests = [CallRequest("interpreter_only_softmax", "fwd", "bf16", (2, 16)),
                CallRequest("thirdparty_softmax", "bwd", "fp16", (2, 16))]
    bad, good = check_calls([str(INTERPRETER_ONLY), str(BF16)], requests)
    assert bad.compiles is False and "global variable LOG2E" in bad.failure()
    assert good.compiles is True and all(c.regs > 0 for c in good.launches)


def test_verify_under_the_interpreter_fails_a_kernel_that_does_not_compile(tmp_path) -> None:
    out = tmp_path / "verify.json"
    cmd = [sys.executable, "-W", "ignore", "-m", "elasticbench", "verify", "--kernel-file",
           str(INTERPRETER_ONLY), "--kernel-file", str(BF16), "--quick", "-d", "fp32,bf16",
           "--input", "normal", "--json", str(out)]
    env = {**devices.interpreter_env(on=True), "COLUMNS": "300"}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    records = json.loads(out.read_text())["records"]
    bad = [r for r in records if r["kernel"] == "interpreter_only_softmax"]
    good = [r for r in records if r["kernel"] == "thirdparty_softmax"]
    assert bad and good
    for r in bad:  # accurate under the interpreter, and still a failed case
        assert not r["passed"] and r["max_budget_frac"] < 1 and r["compile"]["compiles"] is False
        assert r["reason"].startswith("does not compile for sm_90: ")
        assert "triton_interpreter_only.py:23: NameError" in r["reason"]
    for r in good:
        assert r["passed"] and r["compile"]["compiles"] is True
        assert {c["arch"] for c in r["compile"]["launches"]} == {90, 80}
    lines = run.stdout.splitlines()
    for dtype in ("fp32", "bf16"):
        assert any(ln.startswith(f"DOES NOT COMPILE interpreter_only_softmax {dtype} for sm_90")
                   for ln in lines)
        assert any(ln.startswith(f"compiles thirdparty_softmax {dtype} for sm_90, sm_80: "
                                 "softmax_fwd_kernel ") and ln.endswith("no spills")
                   for ln in lines), run.stdout
    # the printed command re-runs exactly the failing cases, interpreter included
    printed = [ln.split("reproduce: ", 1)[1] for ln in lines if "reproduce: " in ln]
    assert len(printed) == 3  # one per shape of the quick matrix's normal input
    assert all(ln.startswith("TRITON_INTERPRET=1 elasticbench verify --quick --only "
                             "interpreter_only_softmax --dtype fp32,bf16 --input normal --size ")
               for ln in printed)
    line = printed[0]
    env = devices.interpreter_env(on=False, env=env)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    again = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    head = next(ln for ln in lines if ln.startswith("FAIL "))
    assert [ln for ln in again.stdout.splitlines() if ln.startswith("FAIL ")] == [head]
