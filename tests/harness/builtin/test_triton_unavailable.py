"""Without a GPU and without TRITON_INTERPRET=1, Triton kernels cannot run: every command says
so, with the reason `list backends` gives, instead of "no kernel matches"."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticbench import devices
from elasticbench.harness.backends import BACKENDS

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "triton_bf16.py"
REASON = "Triton needs a CUDA GPU, or TRITON_INTERPRET=1"

pytestmark = pytest.mark.needs("no_gpu")


@pytest.fixture(autouse=True)
def _no_interpreter(monkeypatch) -> None:
    monkeypatch.delenv(devices.INTERPRET_ENV, raising=False)


def test_list_backends_says_why_triton_is_unavailable(cli) -> None:
    run = cli("list", "backends")
    (line,) = [ln for ln in run.out.splitlines() if ln.startswith("triton")]
    assert f"(not available here: {REASON}" in line
    assert all("not available" not in ln for ln in run.out.splitlines()
               if not ln.startswith("triton"))


@pytest.mark.parametrize("command", ["verify", "run"])
def test_naming_the_backend_gives_the_reason(cli, command) -> None:
    run = cli(command, "--backend", "triton", "--quick")
    assert run.code == 2
    assert run.err.strip().splitlines() == [
        f"elasticbench: error: backend triton cannot run here: {REASON} to run its kernels "
        "on the CPU in Triton's interpreter"]


def test_list_and_verify_agree_on_every_backend(cli) -> None:
    listed = cli("list", "backends").out
    for name, backend in BACKENDS.items():
        # flex_attention's one kernel is an attention baseline, verified when named
        which = ("--only", name) if name == "flex_attention" else ("-f", "softmax")
        run = cli("verify", "--backend", name, "--quick", "-d", "fp32", "--input", "normal",
                  *which)
        why = backend.unavailable()
        assert (f"{name} " in listed) and ((why is None) == (run.code == 0)), run.err
        if why:
            assert why in run.err and why in listed


def test_a_kernel_file_of_triton_kernels_is_refused_with_the_reason(cli) -> None:
    run = cli("verify", "--kernel-file", str(FIXTURE), "--quick")
    assert run.code == 2
    assert "thirdparty_softmax (triton) cannot run here: " + REASON in run.err


def test_a_builtin_named_with_only_says_why_it_is_not_loaded(cli) -> None:
    run = cli("verify", "--only", "triton_softmax", "--quick")
    assert run.code == 2
    assert f"not loaded: the triton built-ins ({REASON}" in run.err


def test_other_backends_run_and_triton_is_left_out_with_a_note(cli) -> None:
    run = cli("verify", "--backend", "numpy,triton", "-f", "softmax", "--quick", "-d", "fp32",
              "--input", "normal")
    assert run.code == 0
    assert f"elasticbench: note: left out backend triton: {REASON}" in run.err
    assert "numpy_softmax" in run.out and "triton_softmax" not in run.out
