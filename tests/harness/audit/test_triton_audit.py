"""The Triton kernels compiled for sm_90 (H100/H200) on this GPU-less machine: the static audit.

The audit runs as its own process (importing the kernels registers the triton backend, which
the rest of the suite must not see). What it checks holds for the compiled code, not a model:
no register spills, 128-bit global loads and stores, the exponential on the approximate ex2
unit (whose flush-to-zero the kernels work around), no IEEE division per element where the
output is 16-bit, and that every kernel compiles at all (the interpreter accepts code that
the compiler rejects).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elasticbench import devices

pytestmark = pytest.mark.needs("triton")

# What the compiler makes of the kernels is a property of one Triton: on another (the second
# Triton of tests/harness/audit/test_triton_versions.py) a difference is reported as a skip that says it.
TRITON = importlib.metadata.version("triton")
PINNED = next(ln.split("==")[1].strip() for ln in
              (Path(__file__).resolve().parents[3] / "requirements.lock").read_text().splitlines()
              if ln.startswith("triton=="))


def compiler_fact(ok: bool, what: str) -> None:
    """Assert what the pinned Triton compiles; on another, skip with what differs."""
    if TRITON != PINNED and not ok:
        pytest.skip(f"Triton {TRITON} (not the pinned {PINNED}): {what}")
    assert ok, what


@pytest.fixture(scope="module")
def audits(tmp_path_factory) -> list[dict]:
    """The audit's JSON, computed once per test session: under pytest-xdist the workers share
    it (the first computes it under a lock, the others read it), as it takes 15 s of a core."""
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    out = shared / "triton-audit.json"
    with open(shared / "triton-audit.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            env = {**devices.interpreter_env(on=False), "TRITON_DEFAULT_FP_FUSION": "1"}
            part = out.with_suffix(".part")
            cmd = [sys.executable, "-m", "elasticbench.harness.audit", "--gpu", "h100-sxm",
                   "-d", "fp32,bf16", "--sizes", "4096,65536", "--json", str(part)]
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            assert run.returncode == 0, run.stderr[-4000:]
            part.rename(out)
    return json.loads(out.read_text())["audits"]


def test_every_kernel_compiles_for_both_paths(audits) -> None:
    got = {(a["kernel"], a["mode"], a["dtype"], a["path"]) for a in audits}
    names = {("triton_elastic", "fwd"), ("triton_softmax", "fwd"), ("triton_softmax1", "fwd"),
             ("triton_stablemax", "fwd"), ("triton_symax", "fwd"), ("triton_elastic", "bwd")}
    # 4096 columns fit one program; 65536 stream on whichever path the launch plan takes
    streamed = {"online", "split", "resident"}
    assert {(k, m, d) for k, m, d, _ in got} == {(k, m, d) for k, m in names
                                                for d in ("fp32", "bf16")}
    by_n = {(a["kernel"], a["mode"], a["dtype"], a["n"]): a["path"] for a in audits}
    assert all(by_n[(k, m, d, 4096)] == "fused" and by_n[(k, m, d, 65536)] in streamed
               for k, m in names for d in ("fp32", "bf16")), by_n


def test_no_spills_and_full_width_memory_access(audits) -> None:
    for a in audits:
        where = f"{a['kernel']} {a['mode']} {a['dtype']} n={a['n']}"
        # fp32 online kernels save one 64-bit register per row (STL.64 before the pass that
        # calls the division's slow path, LDL after it): not per element, so not a spill
        compiler_fact(a["local_stores"] <= 1,
                      f"{where} spills registers ({a['local_stores']} STL)")
        # the resident path also reads its row's partials, a few fp32 per program, 32 bits
        # each: not per element
        data_loads = [b for b in a["ldg_bits"] if a["path"] != "resident" or b != 32]
        assert data_loads == [128], f"{where} loads {a['ldg_bits']} bits per thread"
        assert max(a["stg_bits"]) == 128, f"{where} stores {a['stg_bits']} bits per thread"
        assert a["programs_per_sm"] >= 1 and a["regs"] <= 255


def test_exponentials_run_on_the_flushing_approximate_ex2(audits) -> None:
    # the SUBNORMAL path of the kernels' exp2 (kernels/triton/exp_family.py) exists because this ex2 flushes; if a
    # Triton upgrade changes the lowering, this says to look again
    for a in audits:
        if a["kernel"] in ("triton_stablemax", "triton_symax"):
            assert a["ptx_ex2_approx"] == 0
        else:
            assert a["ptx_ex2_approx"] > 0 and a["ptx_ex2_ftz"], a


def test_correctly_rounded_divisions_keep_subnormal_results(audits) -> None:
    flushing = [f"{a['kernel']} {a['mode']} {a['dtype']} n={a['n']}" for a in audits
                if a["ptx_div_ftz"]]
    compiler_fact(not flushing, f"tl.math.div_rn flushes subnormal quotients (div.rn.ftz.f32) "
                                f"in {', '.join(flushing[:3])}")


def test_16_bit_outputs_divide_per_row_not_per_element(audits) -> None:
    for a in audits:
        per_thread = a["block"] // (32 * a["num_warps"])
        if a["dtype"] == "bf16" and a["kernel"] != "triton_stablemax":
            assert a["ptx_div_rn"] < per_thread, a  # a per-element division would be >= it
        if a["dtype"] == "fp32" and a["mode"] == "fwd" and a["path"] == "fused":
            assert a["ptx_div_rn"] >= per_thread  # fp32 keeps the correctly rounded quotient


# The attention compile audits as committed (results/triton-audit/attention-triton-*.json,
# `elasticbench audit --attention --json`): read, never recompiled here (a full audit is an
# hour of a core per Triton). What fails: a file that contradicts itself, a configuration
# still offered that the file says fails, or a file that says complete=true yet misses a
# configuration the lists offer now (a list grew without an audit). What only warns: the
# kernel source changed since the audit (audits lag kernel edits; the next audit says).
AUDITS = Path(__file__).resolve().parents[3] / "results" / "triton-audit"
KERNEL_SOURCE = Path(__file__).resolve().parents[3] / "kernels" / "triton" / "flash_attention.py"
_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _attention_audits() -> list[Path]:
    return sorted(AUDITS.glob("attention-triton-*.json"))


def _offered_now(record: dict) -> set[tuple]:
    """(kernel, head dim, dtype, causal, padded, weight, tiles text, gate) of every
    configuration the lists offer now for the file's dtypes, weights and head dims (what the
    audit command enumerates: pointer and TMA lists, each causal and key-padding case, the
    forward without and with the gate)."""
    import itertools

    import torch

    from elasticbench.attention.weights import Weight
    from elasticbench.kernels.triton import attention_configs as ac

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    out = set()
    for weight, dtype, kernel, head_dim, causal, padded, tma in itertools.product(
            record["weights"], record["dtypes"], ac.KERNELS, record["head_dims"],
            (False, True), (False, True), (False, True)):
        for t in ac.configs(kernel, head_dim, dtypes[dtype], causal, Weight[weight.upper()],
                            tma, padded):
            for gate in (False, True) if kernel == "fwd" else (False,):
                out.add((kernel, head_dim, _DTYPE_NAMES[dtype], causal, padded, weight, str(t),
                         gate))
    return out


def _audited(report: dict) -> tuple:
    return (report["kernel"], report["head_dim"], report["dtype"], report["causal"],
            report["padded"], report["weight"], report["tiles"], report.get("gate", False))


def test_the_committed_attention_audits_are_consistent_and_cover_what_they_claim() -> None:
    import hashlib
    import warnings

    paths = _attention_audits()
    assert {p.name for p in paths} >= {"attention-triton-3.6.0.json",
                                       "attention-triton-3.9.0.json"}
    source = hashlib.sha256(KERNEL_SOURCE.read_bytes()).hexdigest()
    for path in paths:
        record = json.loads(path.read_text())
        version = path.stem.removeprefix("attention-triton-")
        assert record["triton"] == version and record["arch"] == 90, path.name
        reports = record["reports"]
        assert record["configurations"] == len(reports), path.name
        assert record["failing"] == sum(1 for r in reports if r["problems"]), path.name
        audited = [_audited(r) for r in reports]
        assert len(set(audited)) == len(audited), f"{path.name} audits a configuration twice"
        offered = _offered_now(record)
        still_failing = sorted(str(a) for a, r in zip(audited, reports, strict=True)
                               if r["problems"] and a in offered)
        assert not still_failing, f"{path.name}: offered, yet the audit says they fail: " + \
            "; ".join(still_failing[:5])
        missing = sorted(str(a) for a in offered - set(audited))
        if record["complete"]:
            assert record["configurations"] == record["of"], path.name
            assert not missing, (f"{path.name} says complete, yet {len(missing)} offered "
                                 f"configurations are not in it, e.g. {missing[0]}: audit "
                                 "again (docs/attention.md section 7)")
        else:
            warnings.warn(f"{path.name}: a partial audit ({record['configurations']} of "
                          f"{record['of']}); {len(missing)} offered configurations unaudited",
                          stacklevel=1)
        if record["kernel_sha256"] != source:
            warnings.warn(f"{path.name} audited kernels/triton/flash_attention.py at commit "
                          f"{record['commit'][:7]}; the file has changed since: audit again "
                          "before trusting it for the current kernel", stacklevel=1)
