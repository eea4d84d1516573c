"""The Triton row kernels' launch plans compiled for sm_90 (scripts/triton_rows_audit.py): every
launch the GPU shapes take (fused, several rows a program, split rows, resident rows, forward and
backward) compiles, with no register spill, 128-bit loads of the rows and 128-bit stores of the
outputs (docs/triton.md, "Triton 3.6.0").

Compiled here on Triton 3.6.0 (what the GPU machines have): in the second Triton's child pytest
(tests/harness/audit/test_triton_versions.py, CI), about a minute of compiling; a run on
another Triton skips it. The committed audits
(results/triton-audit/rows-h100-sxm*.json, one per Triton) must say the same of every shape
the script compiles, on the pinned Triton and on 3.6.0: read, not compiled again (CI compiled
the pinned Triton's too, a minute that only repeated the committed file and 3.6.0's check)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from elasticbench import devices

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "triton_rows_audit.py"
# the Triton this process imports (the second Triton's child puts 3.6.0 first on the path)
try:
    TRITON: str | None = importlib.metadata.version("triton")
except importlib.metadata.PackageNotFoundError:
    TRITON = None
AUDITS = ROOT / "results" / "triton-audit"
PINNED = next(ln.split("==")[1].strip() for ln in (ROOT / "requirements.lock").read_text()
              .splitlines() if ln.startswith("triton=="))
# the shapes checked below (the script's others repeat their kernels' paths)
SHAPES = "256x262144,65536x128,4096x4096,512x16384,1024x65536"


def _check(rows: list[dict]) -> None:
    """Every plan and launch the asserted shapes take is there; none spills or fails to
    compile; whole rows move in 128-bit loads and stores."""
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


@pytest.mark.parametrize(("name", "version"), [("rows-h100-sxm.json", PINNED),
                                               ("rows-h100-sxm-triton-3.6.0.json", "3.6.0")])
def test_the_committed_rows_audits_are_clean(name, version) -> None:
    audit = json.loads((AUDITS / name).read_text())
    assert audit["triton"] == version and audit["arch"] == 90, (
        f"{name} audits Triton {audit['triton']}, not {version}: run scripts/triton_rows_audit.py "
        "again with that Triton")
    shapes = {tuple(r["shape"]) for r in audit["rows"]}
    assert {tuple(map(int, s.split("x"))) for s in SHAPES.split(",")} <= shapes
    _check(audit["rows"])


@pytest.mark.ci
@pytest.mark.needs("triton")
@pytest.mark.skipif(TRITON != "3.6.0", reason=f"Triton {TRITON}: compiled on 3.6.0, in the "
                    "second Triton's run (ELASTICBENCH_OTHER_TRITON=3.6.0 pytest "
                    "tests/harness/audit/test_triton_versions.py)")
def test_every_row_plan_compiles_without_spills_on_triton_3_6_0(tmp_path) -> None:
    out = tmp_path / "rows.json"
    env = {**devices.interpreter_env(on=False), "TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--shapes", SHAPES, "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    audit = json.loads(out.read_text())
    assert audit["triton"] == "3.6.0"
    _check(audit["rows"])
