"""The Triton launcher's host side: its options, row paths and occupancy model.

Nothing here launches a kernel, so it runs in the ordinary test process (importing the
kernels' package registers nothing).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("triton")

from elasticbench import devices, settings
from elasticbench.kernels.triton.launch import (
    H100_SMS,
    LaunchOptions,
    RowPlan,
    SMLimits,
    current_options,
    launch_options,
    plan,
    plan_rows,
    resident_programs,
)


def test_options_default_and_from_the_environment() -> None:
    assert settings.read({}).launch == LaunchOptions(max_fused=16384, chunk=4096, exp2_ulps=-1)
    env = {"ELASTICBENCH_TRITON_MAX_FUSED": "32", "ELASTICBENCH_TRITON_CHUNK": " 16 ",
           "ELASTICBENCH_TRITON_EXP2_ULPS": "2", "ELASTICBENCH_TRITON_SPLITS": "3",
           "ELASTICBENCH_TRITON_ROW_BLOCK": "8"}
    assert settings.read(env).launch == LaunchOptions(max_fused=32, chunk=16, exp2_ulps=2,
                                                      splits=3, row_block=8)


@pytest.mark.parametrize(("var", "value", "message"), [
    ("ELASTICBENCH_TRITON_MAX_FUSED", "48", r"\$ELASTICBENCH_TRITON_MAX_FUSED: max_fused must be a power of two, got 48"),
    ("ELASTICBENCH_TRITON_CHUNK", "0", r"\$ELASTICBENCH_TRITON_CHUNK: chunk must be a power of two, got 0"),
    ("ELASTICBENCH_TRITON_CHUNK", "big", r"\$ELASTICBENCH_TRITON_CHUNK: must be an integer, got 'big'"),
    ("ELASTICBENCH_TRITON_EXP2_ULPS", "-3", r"\$ELASTICBENCH_TRITON_EXP2_ULPS: exp2_ulps must be an integer >= -1, got -3"),
    ("ELASTICBENCH_TRITON_SPLITS", "-1", r"\$ELASTICBENCH_TRITON_SPLITS: splits must be an integer >= 0 \(0: automatic\), got -1"),
    ("ELASTICBENCH_TRITON_ROW_BLOCK", "3", r"\$ELASTICBENCH_TRITON_ROW_BLOCK: row_block must be 0 \(automatic\) or a power of two, got 3"),
    ("ELASTICBENCH_TRITON_RESIDENT", "2", r"\$ELASTICBENCH_TRITON_RESIDENT: resident must be -1 \(never\), 0 \(the table's choice\) or 1 \(wherever it runs\), got 2"),
])
def test_bad_environment_values_name_the_variable(var, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        settings.read({var: value})


def test_per_call_options_override_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("ELASTICBENCH_TRITON_CHUNK", "64")
    try:
        # read at the first call that needs them (or when refreshed), not at import
        assert settings.refresh().launch.chunk == 64
        assert current_options().chunk == 64
        with launch_options(max_fused=32) as outer:
            assert outer == LaunchOptions(max_fused=32, chunk=64)
            with launch_options(chunk=8):
                assert current_options() == LaunchOptions(max_fused=32, chunk=8)
            assert current_options() == outer
        assert current_options() == LaunchOptions(chunk=64)
        with pytest.raises(ValueError, match="power of two"), launch_options(chunk=12):
            pass
    finally:
        monkeypatch.undo()
        settings.refresh()


def test_row_paths() -> None:
    assert plan(4096, 16384, 4096) == (True, 4096)
    assert plan(4097, 16384, 4096) == (True, 8192)  # fused: the block covers the row
    assert plan(16385, 16384, 4096) == (False, 4096)  # online, in chunks
    assert plan(33, 32, 64) == (False, 64)
    assert plan(1, 16, 16) == (True, 1)


def test_launch_table_on_an_h100() -> None:
    auto = LaunchOptions()
    # the shapes of cases/gpu.toml: rows that fill the GPU stay one program per row
    assert plan_rows(512, 4096, 4, auto, H100_SMS) == RowPlan("fused", 4096, 8)
    assert plan_rows(4096, 4096, 2, auto, H100_SMS) == RowPlan("fused", 4096, 8)
    # 256 long rows are 2 programs per SM: each row split in 4 programs of 16 chunks
    assert plan_rows(256, 262144, 4, auto, H100_SMS) == RowPlan("split", 4096, 8, splits=4,
                                                                span=65536)
    assert plan_rows(1, 262144, 2, auto, H100_SMS) == RowPlan("split", 4096, 8, splits=64,
                                                              span=4096)  # one per chunk
    assert plan_rows(4096, 262144, 4, auto, H100_SMS).path == "online"  # enough rows
    # short rows: 2048 (fp32) or 4096 (16-bit) elements a program, while >= 4 per SM remain
    assert plan_rows(65536, 128, 4, auto, H100_SMS) == RowPlan("rows", 128, 8, row_block=16)
    assert plan_rows(65536, 128, 2, auto, H100_SMS) == RowPlan("rows", 128, 8, row_block=32)
    assert plan_rows(4096, 128, 4, auto, H100_SMS) == RowPlan("rows", 128, 4, row_block=4)
    assert plan_rows(512, 128, 4, auto, H100_SMS).path == "fused"  # too few rows to group
    assert plan_rows(65536, 2048, 4, auto, H100_SMS).path == "fused"  # wide enough alone
    # the backward holds three arrays: half the forward's register-resident rows
    assert plan_rows(512, 16384, 4, auto, H100_SMS, max_fused=8192).path == "split"
    assert plan_rows(512, 16384, 4, auto, H100_SMS).path == "fused"


def test_launch_table_follows_the_options() -> None:
    # splits: 1 never splits; N splits into at most N programs of whole chunks
    assert plan_rows(2, 100, 4, LaunchOptions(max_fused=16, chunk=16, splits=1),
                     H100_SMS) == RowPlan("online", 16, 4)
    assert plan_rows(2, 160, 4, LaunchOptions(max_fused=16, chunk=16, splits=3),
                     H100_SMS) == RowPlan("split", 16, 4, splits=3, span=64)  # 4+4+2 chunks
    assert plan_rows(2, 40, 4, LaunchOptions(max_fused=16, chunk=16, splits=99),
                     H100_SMS).splits == 3  # one program per chunk at most
    # row_block: forced, capped by the rows there are
    assert plan_rows(6, 40, 4, LaunchOptions(row_block=4), H100_SMS) == RowPlan(
        "rows", 64, 4, row_block=4)
    assert plan_rows(3, 40, 4, LaunchOptions(row_block=64), H100_SMS).row_block == 4
    assert plan_rows(6, 40, 4, LaunchOptions(row_block=1), H100_SMS).path == "fused"
    assert RowPlan("split", 4096, 8, splits=4, span=65536).describe() == \
        "split 4x65536 (4096-chunks, 8 warps)"
    assert RowPlan("rows", 128, 8, row_block=16).describe() == "rows 16x128 (8 warps)"


def test_resident_path_in_the_launch_table() -> None:
    auto = LaunchOptions()
    assert settings.read({"ELASTICBENCH_TRITON_RESIDENT": "-1"}).launch.resident == -1
    # where a cooperative launch exists, streamed rows are read once: 4096-wide blocks (the
    # chunk), as many programs a row as that takes while one per SM can hold a row
    assert plan_rows(256, 262144, 4, auto, H100_SMS, resident=True) == RowPlan(
        "resident", 4096, 8, splits=64, span=4096)
    assert plan_rows(256, 262144, 4, auto, H100_SMS, resident=True).describe() == \
        "resident 64x4096 (8 warps)"
    assert plan_rows(4096, 262144, 2, auto, H100_SMS, resident=True).path == "resident"
    assert plan_rows(1, 1 << 21, 4, auto, H100_SMS, resident=True) == RowPlan(
        "resident", 16384, 16, splits=128, span=16384)  # blocks grow to fit 132 SMs
    assert plan_rows(1, 132 * 16384 + 1, 4, auto, H100_SMS, resident=True).path == "split"
    # the backward's blocks stop at its register-resident limit
    assert plan_rows(256, 262144, 4, auto, H100_SMS, max_fused=8192, resident=True) == RowPlan(
        "resident", 4096, 8, splits=64, span=4096)
    assert plan_rows(1, 1 << 21, 4, auto, H100_SMS, max_fused=8192,
                     resident=True).path == "split"
    # never without a cooperative launch, nor where told not to; a forced split count is the
    # two-read path's unless resident=1, where it sets the programs a row
    assert plan_rows(256, 262144, 4, auto, H100_SMS).path == "split"
    never = LaunchOptions(resident=-1)
    assert plan_rows(256, 262144, 4, never, H100_SMS, resident=True).path == "split"
    assert plan_rows(256, 262144, 4, LaunchOptions(splits=16), H100_SMS,
                     resident=True).path == "split"
    assert plan_rows(256, 262144, 4, LaunchOptions(splits=16, resident=1), H100_SMS,
                     resident=True) == RowPlan("resident", 16384, 16, splits=16, span=16384)
    assert plan_rows(256, 262144, 4, LaunchOptions(splits=1, resident=1), H100_SMS,
                     resident=True).path == "online"
    # short rows are fused whatever resident says; on 4 "SMs", 4 programs a row at most
    assert plan_rows(8, 4096, 4, LaunchOptions(resident=1), H100_SMS, resident=True).path == \
        "fused"
    small = LaunchOptions(max_fused=16, chunk=16, resident=1)
    assert plan_rows(5, 50, 4, small, 4, resident=True) == RowPlan("resident", 16, 4, splits=4,
                                                                  span=16)
    assert plan_rows(5, 65, 4, small, 4, resident=True).path == "split"


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
             "print('elasticbench.harness.builtin.triton_kernels' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", probe], env=devices.interpreter_env(on=False),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False"]
