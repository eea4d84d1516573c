"""The Triton row kernels' launch safety on the host side (kernels/triton/launch.py): barrier
counters of their own under CUDA-graph capture, launch options read once, the interpreter's
patch off the import path, and long rows of any length sharing compiled kernels.

Nothing here runs a kernel: launches are recorded (elasticbench.harness.audit.capture) and keyed as
Triton's JIT keys its compiled kernels, so it runs in the ordinary test process, without a GPU
and without the interpreter. The bounded barrier wait itself runs under the interpreter in
tests/library/test_triton_resident.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

import pytest
import torch

pytest.importorskip("triton")

from elasticbench import devices, settings
from elasticbench.kernels.triton import launch

pytestmark = pytest.mark.skipif(devices.triton_interpreted(),
                                reason="host-side checks: the compiler's launches, not the "
                                       "interpreter's")


# ---------------------------------------------------------------------------------------
# Barrier counters under capture


def test_each_captured_call_gets_zeroed_counters_of_its_own(monkeypatch) -> None:
    x = torch.empty(3, 8)
    monkeypatch.setattr(launch, "_COUNTERS", {})
    monkeypatch.setattr(launch, "capturing", lambda device: True)
    first, second = launch.row_counters(x, 5), launch.row_counters(x, 5)
    assert first.data_ptr() != second.data_ptr()  # two launches (two graphs) share nothing
    assert first.dtype == torch.int32 and first.tolist() == [0] * 5 == second.tolist()
    assert launch._COUNTERS == {}  # the eager buffer is neither made nor used under capture
    monkeypatch.setattr(launch, "capturing", lambda device: False)
    eager = launch.row_counters(x, 5)
    assert launch.row_counters(x, 3).data_ptr() == eager.data_ptr()  # reused, never refilled
    assert launch.row_counters(x, 11).numel() == 11  # grown for more rows


def test_capture_is_asked_of_the_tensors_device(monkeypatch) -> None:
    asked: list[int] = []

    class Device:  # stands in for torch.cuda.device: records the device made current
        def __init__(self, index: int) -> None:
            asked.append(index)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Device)
    assert launch.capturing(torch.device("cpu")) is False
    assert launch.capturing(torch.device("cuda", 0)) is True and asked == []
    assert launch.capturing(torch.device("cuda", 1)) is True and asked == [1]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert launch.capturing(torch.device("cuda", 0)) is False


def test_a_launch_goes_to_its_tensors_device(monkeypatch) -> None:
    current: list[int] = [0]
    launched: list[tuple] = []

    class Device:  # torch.cuda.device: makes `index` current within the block
        def __init__(self, index: int) -> None:
            self.index = index

        def __enter__(self) -> None:
            self.saved, current[0] = current[0], self.index

        def __exit__(self, *exc: object) -> None:
            current[0] = self.saved

    class Kernel:  # records the device current at each launch
        def __getitem__(self, grid: tuple) -> object:
            return lambda *args, **kwargs: launched.append((current[0], grid, kwargs))

    class Tensor:
        def __init__(self, index: int) -> None:
            self.device = torch.device("cuda", index)

    monkeypatch.setattr(launch, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", Device)
    launch.run(Kernel(), (3,), (Tensor(1),), 4, {"BLOCK": 16})
    launch.run(Kernel(), (2,), (Tensor(0),), 4, {"BLOCK": 16}, cooperative=True)
    assert [(dev, grid) for dev, grid, _ in launched] == [(1, (3,)), (0, (2,))]
    assert current == [0]  # the caller's device is current again
    assert launched[1][2] == {"num_warps": 4, "enable_fp_fusion": True,
                              "launch_cooperative_grid": True, "BLOCK": 16}


# ---------------------------------------------------------------------------------------
# Configuration read once


def test_launch_options_are_read_from_the_environment_once(monkeypatch) -> None:
    reads: list[int] = []
    real = settings.read

    def counted(environ: Mapping[str, str]) -> settings.Settings:
        reads.append(1)
        return real(environ)

    monkeypatch.setattr(settings, "read", counted)
    monkeypatch.setenv("ELASTICBENCH_TRITON_CHUNK", "64")
    try:
        assert settings.refresh().launch.chunk == 64
        monkeypatch.setenv("ELASTICBENCH_TRITON_CHUNK", "32")
        for _ in range(100):
            assert launch.current_options().chunk == 64  # a call reads no variable
        assert len(reads) == 1
        assert settings.refresh().launch.chunk == 32 and len(reads) == 2
    finally:
        monkeypatch.undo()
        settings.refresh()
    assert launch.current_options() == settings.read(os.environ).launch


def test_the_library_imports_no_interpreter_patch() -> None:
    probe = ("import sys\n"
             "from elasticbench.kernels.triton import (elastic_backward, exp_family, launch, "
             "tier, weight_family)\n"
             "from elasticbench.rows import tiers\n"
             "print('elasticbench.triton_interpreter' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", probe], env=devices.interpreter_env(on=False),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False"]


# ---------------------------------------------------------------------------------------
# Long rows of any length share compiled kernels


def _jit_keys(launches: list) -> dict[str, set[str]]:
    """Per kernel, the keys Triton's JIT caches compiled kernels under (runtime/jit.py: the
    binder's specialization and options, compute_cache_key) for sm_90: one compile each."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import compute_cache_key, create_function_from_signature

    backend = make_backend(GPUTarget("cuda", 90, 32))
    keys: dict[str, set[str]] = {}
    for rec in launches:
        bind = create_function_from_signature(rec.kernel.signature, rec.kernel.params, backend)
        _, specialization, options = bind(*rec.args, **rec.kwargs)
        keys.setdefault(rec.name, set()).add(compute_cache_key({}, specialization, options))
    return keys


@pytest.mark.parametrize(("rows", "lengths", "options", "path"), [
    # 16 rows: split into 37-61 programs a row (one 4096-chunk each), 64 partials a row
    (16, (150_001, 170_003, 200_005, 250_007), {"resident": -1}, "split"),
    # 256 rows: 66-123 resident programs a row of 4096 columns each
    (256, (270_001, 300_001, 400_001, 500_001), {}, "resident"),
])
def test_long_rows_of_any_length_share_compiled_kernels(rows, lengths, options, path) -> None:
    from elasticbench.harness.audit.capture import capture_launches
    from elasticbench.kernels.triton.elastic_backward import elastic_backward
    from elasticbench.kernels.triton.exp_family import elastic_forward

    if path == "resident" and not launch.resident_available(torch.empty(1)):
        pytest.skip("this Triton has no cooperative launch")
    recorded = []
    splits = set()
    for n in lengths:
        x = torch.empty(rows, n, dtype=torch.bfloat16)
        with launch.launch_options(**options), capture_launches() as launches:
            elastic_forward(x, 1.0, 0.5)
            elastic_backward(x, x, x, 1.0, 0.5)
        assert {p.path for p in launch.PLANS.values() if p.block == 4096} >= {path}
        splits |= {rec.kwargs["SPLITS"] for rec in launches if "SPLITS" in rec.kwargs}
        recorded += launches
    assert len(splits) == len(lengths)  # every length its own programs per row ...
    keys = _jit_keys(recorded)
    assert {name: len(k) for name, k in keys.items()} == dict.fromkeys(keys, 1), keys
    assert len(keys) >= 3  # ... and one compiled kernel per kernel for all of them


# ---------------------------------------------------------------------------------------
# No kernel per call for a float parameter beside a tensor one


def test_a_float_parameter_is_filled_once_per_value(monkeypatch) -> None:
    from elasticbench.kernels.triton import tier

    x = torch.empty(2, 4)
    monkeypatch.setattr(tier, "_CONSTANTS", {})
    first = tier._tensor(0.5, x)
    assert first.dtype == torch.float32 and first.ndim == 0 and first.item() == 0.5
    assert tier._tensor(0.5, x) is first  # reused: no fill on later calls
    assert tier._tensor(None, x).item() == 0.0
    given = torch.tensor([[0.7]])
    assert tier._tensor(given, x) is not given and tier._tensor(given, x).equal(given)
    monkeypatch.setattr(launch, "capturing", lambda device: True)
    assert tier._tensor(0.5, x) is not first  # under capture: filled in the graph
    assert set(tier._CONSTANTS) == {(x.device, 0.5), (x.device, 0.0)}
