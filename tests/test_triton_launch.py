"""The Triton launcher's host side: its options, row paths and occupancy model.

Nothing here launches a kernel, so it runs in the ordinary test process (importing the
kernels' package registers nothing).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("triton")

from elasticbench import devices
from elasticbench.kernels.triton.launch import (
    LaunchOptions,
    SMLimits,
    current_options,
    launch_options,
    options_from_env,
    plan,
    resident_programs,
)


def test_options_default_and_from_the_environment() -> None:
    assert options_from_env({}) == LaunchOptions(max_fused=16384, chunk=4096, exp2_ulps=-1)
    env = {"ELASTICBENCH_TRITON_MAX_FUSED": "32", "ELASTICBENCH_TRITON_CHUNK": " 16 ",
           "ELASTICBENCH_TRITON_EXP2_ULPS": "2"}
    assert options_from_env(env) == LaunchOptions(max_fused=32, chunk=16, exp2_ulps=2)


@pytest.mark.parametrize(("var", "value", "message"), [
    ("ELASTICBENCH_TRITON_MAX_FUSED", "48", r"\$ELASTICBENCH_TRITON_MAX_FUSED: max_fused must be a power of two, got 48"),
    ("ELASTICBENCH_TRITON_CHUNK", "0", r"\$ELASTICBENCH_TRITON_CHUNK: chunk must be a power of two, got 0"),
    ("ELASTICBENCH_TRITON_CHUNK", "big", r"\$ELASTICBENCH_TRITON_CHUNK: must be an integer, got 'big'"),
    ("ELASTICBENCH_TRITON_EXP2_ULPS", "-3", r"\$ELASTICBENCH_TRITON_EXP2_ULPS: exp2_ulps must be an integer >= -1, got -3"),
])
def test_bad_environment_values_name_the_variable(var, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        options_from_env({var: value})


def test_per_call_options_override_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("ELASTICBENCH_TRITON_CHUNK", "64")
    assert current_options().chunk == 64  # read when a kernel is called, not at import
    with launch_options(max_fused=32) as outer:
        assert outer == LaunchOptions(max_fused=32, chunk=64)
        with launch_options(chunk=8):
            assert current_options() == LaunchOptions(max_fused=32, chunk=8)
        assert current_options() == outer
    assert current_options() == LaunchOptions(chunk=64)
    with pytest.raises(ValueError, match="power of two"), launch_options(chunk=12):
        pass


def test_row_paths() -> None:
    assert plan(4096, 16384, 4096) == (True, 4096)
    assert plan(4097, 16384, 4096) == (True, 8192)  # fused: the block covers the row
    assert plan(16385, 16384, 4096) == (False, 4096)  # online, in chunks
    assert plan(33, 32, 64) == (False, 64)
    assert plan(1, 16, 16) == (True, 1)


def test_resident_programs() -> None:
    sm = SMLimits()
    assert resident_programs(32, 0, 4, sm) == 16  # warp slots: 64 / 4
    assert resident_programs(128, 0, 8, sm) == 2  # 65536 / (128 * 256)
    assert resident_programs(57, 0, 8, sm) == 4  # 57 rounds up to 64 registers
    assert resident_programs(32, 100_000, 4, sm) == 2  # shared memory, 1 KiB reserved
    assert resident_programs(255, 0, 16, sm) == 1  # never below one


def test_the_autograd_path_imports_the_kernels_without_registering_them() -> None:
    probe = ("import sys\n"
             "from elasticbench.rows import tiers\n"
             "assert tiers.implementation('triton').name == 'triton'\n"
             "from elasticbench.kernels.triton import tier\n"
             "assert tier._kernels() is not None\n"
             "print('elasticbench.kernels.triton_kernels' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", probe], env=devices.interpreter_env(on=False),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False"]
