"""Launch notes: what a kernel call launched reaches the record of the run that timed it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from elasticbench import launches


def test_notes_are_collected_in_order_once_each_and_only_inside_noting() -> None:
    launches.note("dropped: nobody is noting")
    with launches.noting() as notes:
        for d in ("split 8x32768 (4096-chunks, 8 warps)", "fwd 128x64 w8 s3",
                  "split 8x32768 (4096-chunks, 8 warps)"):
            launches.note(d)
        with launches.noting() as inner:  # a nested block collects its own
            launches.note("inner")
    assert notes == ["split 8x32768 (4096-chunks, 8 warps)", "fwd 128x64 w8 s3"]
    assert inner == ["inner"]
    assert launches.summary(notes) == "split 8x32768 (4096-chunks, 8 warps); fwd 128x64 w8 s3"
    assert launches.summary([]) is None


def test_a_triton_row_plan_is_noted_with_its_direction() -> None:
    launch = pytest.importorskip("kernels.triton.launch")
    x = torch.empty(4, 100000)
    plan = launch.plan_rows(4, 100000, 4, launch.LaunchOptions(), launch.H100_SMS)
    with launches.noting() as notes:
        launch.note_plan(SimpleNamespace(__name__="elastic_fused_kernel"), x, plan)
        launch.note_plan(SimpleNamespace(__name__="elastic_bwd_fused_kernel"), x, plan)
    assert notes == [plan.describe(), "backward " + plan.describe()]
    assert plan.path == "split" and notes[0].startswith("split ")


def test_the_triton_backends_environment_carries_its_launch_options(monkeypatch) -> None:
    # a verify record's reproduce command must set the plan it verified
    from elasticbench.harness.backends import get_backend

    monkeypatch.setenv("ELASTICBENCH_TRITON_SPLITS", "4")
    monkeypatch.setenv("ELASTICBENCH_TRITON_ROW_BLOCK", "8")
    monkeypatch.setenv("ELASTICBENCH_TRITONX", "not a launch option")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    env = get_backend("triton").environment()
    assert env == {"ELASTICBENCH_TRITON_ROW_BLOCK": "8", "ELASTICBENCH_TRITON_SPLITS": "4"}
    assert "ELASTICBENCH_TRITON_SPLITS" not in get_backend("cpp").environment()
