"""The Triton row kernels' launch plans compiled for sm_90 (scripts/triton_rows_audit.py): every
launch the GPU shapes take (fused, several rows a program, split rows, forward and backward)
(resident rows included) compiles, with no register spill, 128-bit loads of the rows and 128-bit
stores of the outputs: with the pinned Triton, and with Triton 3.6.0 (what the GPU machines
have) where it is installed alone in .cache/triton/3.6.0 (docs/triton.md, "Triton 3.6.0").
About a minute of compiling each: CI's ci step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elasticbench import devices

pytestmark = [pytest.mark.needs("triton"), pytest.mark.ci]

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "triton_rows_audit.py"


ROOT = Path(__file__).resolve().parents[3]
GPU_TRITON = ROOT / ".cache" / "triton" / "3.6.0"  # as tests/harness/audit/test_triton_versions.py installs


@pytest.mark.parametrize("triton_dir", [None, GPU_TRITON], ids=["pinned", "3.6.0"])
def test_every_row_plan_compiles_without_spills(tmp_path, triton_dir) -> None:
    out = tmp_path / "rows.json"
    env = {**devices.interpreter_env(on=False), "TRITON_DEFAULT_FP_FUSION": "1"}
    if triton_dir is not None:
        if not (triton_dir / "triton" / "__init__.py").is_file():
            pytest.skip(f"Triton 3.6.0 is not installed in {triton_dir} (pip install --no-deps "
                        f"--target {triton_dir} triton==3.6.0)")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(triton_dir),
                                                        env.get("PYTHONPATH")) if p)
    # the shapes asserted on below (the script's others repeat their kernels' paths)
    shapes = "256x262144,65536x128,4096x4096,512x16384,1024x65536"
    run = subprocess.run([sys.executable, str(SCRIPT), "--shapes", shapes, "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    audit = json.loads(out.read_text())
    assert triton_dir is None or audit["triton"] == "3.6.0"
    rows = audit["rows"]
    plans = {(r["shape"][0], r["shape"][1], r["mode"], r["plan"].split()[0]) for r in rows}
    assert {(256, 262144, "fwd", "resident"), (256, 262144, "bwd", "resident"),
            (256, 262144, "fwd", "split"), (256, 262144, "bwd", "split"),
            (65536, 128, "fwd", "rows"), (65536, 128, "bwd", "rows"),
            (4096, 4096, "fwd", "fused"), (512, 16384, "bwd", "split"),
            (512, 16384, "bwd", "resident"), (1024, 65536, "fwd", "resident"),
            (1024, 65536, "fwd", "online")} <= plans
    launches = {r["launch"] for r in rows}
    for name in ("exp_split_partials_kernel", "exp_split_finish_kernel", "exp_rows_kernel",
                 "weight_split_partials_kernel", "weight_split_finish_kernel",
                 "weight_rows_kernel", "elastic_bwd_split_partials_kernel",
                 "elastic_bwd_split_finish_kernel", "elastic_bwd_split_rows_kernel",
                 "elastic_bwd_rows_kernel", "exp_resident_kernel", "weight_resident_kernel",
                 "elastic_bwd_resident_kernel"):
        assert name in launches, name
    for r in rows:
        where = f"{r['launch']} {r['dtype']} {r['shape']}"
        assert "error" not in r, where
        assert r["stl"] == 0 and r["local_bytes"] == 0, f"{where} spills"
        assert 0 < r["regs"] <= 255 and r["programs_per_sm"] >= 1, where
        whole_rows = ("exp_rows_kernel", "weight_rows_kernel", "elastic_bwd_rows_kernel")
        if r["launch"].endswith(("_fused_kernel", "_finish_kernel", "_resident_kernel")) or \
                r["launch"] in whole_rows:
            assert 128 in r["ldg_bits"] and 128 in r["stg_bits"], f"{where}: not 128-bit"
        if r["launch"].endswith("_partials_kernel"):
            assert r["ldg_bits"] == [128], f"{where} loads {r['ldg_bits']}"
