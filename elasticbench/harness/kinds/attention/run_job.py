"""Timing attention kernels against SDPA and the two ceilings measured in the same run.

A case file's [attention_run] table says what to time (docs/attention.md section 6):

    [attention_run]
    description = "..."
    kernels = ["torch_attention_flash", "torch_attention_composite"]   # attention kernels
    optional_kernels = ["triton_symax_attention"]   # timed where registered, else `skipped`
    baseline = "sdpa"                  # softmax attention, the vendor; speedups against it
    dtypes = ["fp32"]
    batch = 1
    heads = 8
    head_dim = 64
    lengths = [512, 1024]              # length_q = length_k
    causal = [0, 1]
    padded = [0, 0.5]                  # optional: the share of each batch's keys padded
    gate = [0, 1]                      # optional ([0]): 1 adds gated cells (out * g)
    modes = ["fwd", "bwd"]
    quadratic = ["torch_attention_composite"]   # kernels that hold the L x L scores
    quadratic_limit_gib = 4.0          # ... skipped (and said so) where they would need more
    [attention_run.max_length]         # optional: the longest length timed for a kernel
    torch_attention_flash = 4096
    seed = 0
    [attention_run.params]             # row parameters shared by every function taking them
    tau = 1.0
    beta = 1.0
    [attention_run.params.symax_attention]    # one function's own (absent: its default)
    eta = 1.0
    [attention_run.params.sigmoid_attention]
    bias = "per length"                # -ln(Lk) at each length (the default), or a number
    [attention_run.timing]             # bench.timing.Policy
    min_reps = 3

`padded` > 0 gives the baseline and the kernels the same (batch, 1, 1, length) bool
key-padding mask (the last keys of each batch hidden) as attn_mask or key_mask, whichever a
kernel declares (kernel_contract.py); a kernel that takes neither is not timed there.
`gate` = 1 adds gated cells: a kernel that declares `gate` is given g (qkv_inputs.
generate_gate, made outside the timed call as q, k, v are) and timed as out * g, its
backward's step(dO) returning d gate too; the baseline runs its ungated call there, so `x
base` is what a gated call costs against the plain baseline; other kernels that declare no
gate are left out of gated cells (the header's `skipped` says so: their ungated time is
the ungated cell's), and a gated cell left with the baseline alone is not timed. Every record of a gated cell has gate = 1.0 in its params (an ungated
one has no gate, as records written before gated cells existed).
Each kernel gets its own function's row parameters (AttentionRunCase.row_params), recorded
in its records' params. Each cell (dtype, length, causal, padded, gate, mode) times the baseline
first, then the kernels (of every function, each timed against that cell's baseline); the
backward is timed as step(dO) alone, after the kernel's untimed first call (the attention
contract, docs/attention.md section 4). The ceilings: copy bandwidth (the bytes a fused
kernel must move: q, k, v and out forward; q, k, v, out, dO and dq, dk, dv backward) and
matmul throughput, measured on GEMMs of attention's own shapes. FLOPs are the matmuls' (4 B H
Lq Lk D forward, 10 backward with the recomputed scores; half under causal masking); a gated
call's bytes add g (and d gate backward). Peak memory growth is the process's resident-set
peak during one call above its size before it (Linux: VmHWM, reset through
/proc/self/clear_refs), taken on a call outside the timing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from elasticbench import devices, launches
from elasticbench.harness.backends import get_backend
from elasticbench.harness.bench.models import wrapped_kernel
from elasticbench.harness.bench.peak_memory import peak_growth
from elasticbench.harness.bench.roofline import measure_copy
from elasticbench.harness.bench.timing import Policy, Timing, time_calls
from elasticbench.harness.execute import Call, guarded_call
from elasticbench.harness.kinds.attention.gating import takes_gate
from elasticbench.harness.kinds.attention.kernel_contract import (
    backward_step,
    kernel_arguments,
    mask_argument,
)
from elasticbench.harness.kinds.attention.qkv_inputs import (
    generate_gate,
    generate_qkv,
    padding_mask,
)
from elasticbench.harness.kinds.attention.run_case import GIB, AttentionRunCase
from elasticbench.harness.kinds.attention.verify_job import (
    given,
    prepare,
    upstream_gradient,
    verify_attention_one,
)
from elasticbench.harness.kinds.attention.verify_matrix import (
    AttentionCase,
    expand_attention,
    load_attention_matrix,
)
from elasticbench.harness.numerics.dtypes import get_format
from elasticbench.harness.records import QuickVerdict, RunRecord
from elasticbench.harness.registry import KernelSpec, get_kernel
from elasticbench.harness.session import Job, Session
from elasticbench.harness.verify.matrix import builtin_case


def attention_flops(b: int, h: int, lq: int, lk: int, d: int, causal: bool, mode: str) -> float:
    """The matmuls' FLOPs: 2 GEMMs forward (4 B H Lq Lk D), 5 backward; half when causal."""
    visible = sum(min(i + 1, lk) for i in range(lq)) if causal else lq * lk
    per = 4 if mode == "fwd" else 10
    return per * b * h * visible * d


def attention_bytes(b: int, h: int, lq: int, lk: int, d: int, itemsize: int, mode: str,
                    gated: bool = False) -> int:
    """The least traffic of a fused kernel: forward q, k, v in and out; backward q, k, v, out,
    dO in and dq, dk, dv out; gated, g in as well (and d gate out backward)."""
    q, kv = b * h * lq * d, b * h * lk * d
    tensors = (2 * q + 2 * kv) if mode == "fwd" else (4 * q + 4 * kv)
    if gated:
        tensors += q if mode == "fwd" else 2 * q
    return tensors * itemsize


def measure_matmul(device: str, dtype: str, case: AttentionRunCase, policy: Policy
                   ) -> dict[str, float]:
    """GFLOP/s of torch matmuls shaped as attention's (B H, L, D) @ (B H, D, L) at L = 1024
    and (B H, L, L) @ (B H, L, D), and of a square 2048^3 GEMM, each at its fastest sample
    (a ceiling is what the machine can do, and on a shared machine the median is not that);
    the largest is the run's FLOP ceiling."""
    import torch

    td = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16}[dtype]
    n, L, d = case.batch * case.heads, 1024, case.head_dim
    a = torch.randn(n, L, d, dtype=td, device=device)
    bt = torch.randn(n, d, L, dtype=td, device=device)
    p = torch.randn(n, L, L, dtype=td, device=device)
    sq = torch.randn(2048, 2048, dtype=td, device=device)
    out = {}
    for name, fn, flops in (("qk", lambda i: torch.bmm(a, bt), 2 * n * L * L * d),
                            ("pv", lambda i: torch.bmm(p, a), 2 * n * L * L * d),
                            ("square", lambda i: sq @ sq, 2 * 2048**3)):
        t = time_calls(fn, policy, devices.clock(device))
        out[name] = flops / t.stats.min_ns
    out["ceiling"] = max(out.values())
    return out


@dataclass(frozen=True)
class AttentionUnit:
    """One timed (kernel, mode, dtype, length, causal, padded, gate): gate 1 is a gated
    cell, where the kernel (never the baseline) is called with a gate."""

    spec: KernelSpec
    dtype: str
    length: int
    causal: int
    baseline: bool
    padded: float = 0.0
    gate: int = 0

    @property
    def key(self) -> tuple:
        return (self.spec.name, self.spec.mode, self.dtype, self.length, self.causal,
                self.padded, self.gate)

    @property
    def cell(self) -> tuple:
        """What the baseline and the kernels share: mode, dtype, length, causal, padded,
        gate."""
        return (self.spec.mode, self.dtype, self.length, self.causal, self.padded, self.gate)

    @property
    def gated(self) -> bool:
        """Whether the timed call takes a gate: a kernel's in a gated cell, not the
        baseline's."""
        return bool(self.gate) and not self.baseline


def _record_cell(r: RunRecord) -> tuple:
    """A record's AttentionUnit.cell (a record without gate in its params is ungated)."""
    return (r.mode, r.dtype, r.shape[2], int(r.params.get("causal", 0)),
            float(r.params.get("padded", 0.0)), int(r.params.get("gate", 0)))


class AttentionRunJob(Job[AttentionUnit]):
    """Ceilings, a quick verification of each kernel, then every unit timed (run's kind)."""

    kind = "run"

    def __init__(self, case: AttentionRunCase, device: str):
        self.case, self.device = case, device
        self.skipped: list[str] = list(case.missing)

    def shape(self, length: int) -> tuple[int, int, int, int, int]:
        c = self.case
        return (c.batch, c.heads, length, length, c.head_dim)

    def _fits(self, spec: KernelSpec, dtype: str, length: int) -> bool:
        """A kernel that holds the scores fits where B H L^2 work-precision floats, three
        times over (scores, weights, one temporary), stay under the case's limit."""
        c = self.case
        if length > c.max_length.get(spec.name, length):
            why = (f"{spec.name} {spec.mode} {dtype} L={length}: past the case's max_length "
                   f"{c.max_length[spec.name]} for it (too slow to time here)")
            if why not in self.skipped:
                self.skipped.append(why)
            return False
        if spec.name not in c.quadratic:
            return True
        need = 3 * c.batch * c.heads * length * length * (8 if dtype == "fp64" else 4)
        if need <= c.quadratic_limit_gib * GIB:
            return True
        why = (f"{spec.name} {spec.mode} {dtype} L={length}: its scores need "
               f"{need / GIB:.3g} GiB, over the case's {c.quadratic_limit_gib:g} GiB")
        if why not in self.skipped:
            self.skipped.append(why)
        return False

    def plan(self) -> list[AttentionUnit]:
        c = self.case
        units = []
        for mode in c.modes:
            for dtype in c.dtypes:
                for length in c.lengths:
                    for causal, padded, gate in ((a, p, g) for a in c.causal
                                                 for p in c.padded for g in c.gate):
                        names = ([(c.baseline, True)] if c.baseline else []) + \
                            [(k, False) for k in c.kernels]
                        cell = []
                        for name, base in names:
                            spec = get_kernel(name, mode)
                            if (spec.supports(dtype) and self._fits(spec, dtype, length)
                                    and self._takes(spec, padded)
                                    and (base or not gate or self._gates(spec))):
                                cell.append(AttentionUnit(spec, dtype, length, causal, base,
                                                          padded, gate))
                        if not gate or any(u.gated for u in cell):  # a lone baseline: none
                            units += cell
        return units

    def _gates(self, spec: KernelSpec) -> bool:
        """Whether a kernel declares `gate` (else it is left out of the gated cells, and
        the header says so)."""
        if takes_gate(spec):
            return True
        why = f"{spec.name} {spec.mode}: declares no gate (left out of the gated cells)"
        if why not in self.skipped:
            self.skipped.append(why)
        return False

    def _mask(self, length: int, padded: float) -> np.ndarray | None:
        """The case's key-padding mask at this length (None where nothing is padded)."""
        c = self.case
        return padding_mask(c.batch, length, padded) if padded else None

    def _takes(self, spec: KernelSpec, padded: float) -> bool:
        """Whether the kernel takes the key-padding mask (said in the header if not)."""
        if mask_argument(spec, self._mask(2, padded)) is not None:
            return True
        why = f"{spec.name} {spec.mode}: takes no key-padding mask (padded {padded:g})"
        if why not in self.skipped:
            self.skipped.append(why)
        return False

    def shard_key(self, unit: AttentionUnit) -> Any:
        return [unit.spec.mode, unit.dtype, unit.length, unit.causal, unit.padded, unit.gate]

    def work(self, units: list[AttentionUnit], session: Session) -> None:
        case = self.case
        done = {(r.kernel, *_record_cell(r)) for r in session.records}
        units = [u for u in units if u.key not in done]
        session.header["skipped"] = self.skipped
        task = session.task(f"{case.name} · ceilings", len(units) + 2)
        backend_llc = devices.llc_bytes(self.device)
        copy_bps, _, _ = measure_copy(self.device, backend_llc, case.timing)
        matmul = {d: measure_matmul(self.device, d, case, case.timing) for d in case.dtypes}
        session.header["ceilings"] = {"copy_gbps": copy_bps / 1e9, "matmul_gflops": matmul}
        task.advance()
        task.describe(f"{case.name} · quick verification")
        verdicts = self._verify({(u.spec.name, u.spec.mode, u.gated): u.spec for u in units},
                                case.dtypes)
        session.header["verification"] = {f"{k}/{m}/{d}{'/gated' if g else ''}": v.to_dict()
                                          for (k, m, g, d), v in verdicts.items()}
        task.advance()
        base_median: dict[tuple, float] = {
            _record_cell(r): r.median_s for r in session.records if r.baseline and r.median_s}
        for u in units:
            task.describe(f"{case.name} · {u.spec.name} {u.spec.mode} {u.dtype} "
                          f"L={u.length}{' causal' if u.causal else ''}"
                          f"{f' padded {u.padded:g}' if u.padded else ''}"
                          f"{(' gated' if u.gated else ' gated cell') if u.gate else ''}")
            record = self._time(u, copy_bps, matmul[u.dtype]["ceiling"],
                                verdicts[(u.spec.name, u.spec.mode, u.gated, u.dtype)])
            cell = u.cell
            if u.baseline and record.median_s:
                base_median[cell] = record.median_s
            elif record.median_s and cell in base_median:
                record.speedup = base_median[cell] / record.median_s
            record.ranked = (not u.baseline and record.error is None
                             and record.verify is not None and record.verify.status == "pass")
            session.add(record)
            task.advance()

    def _verify(self, specs: dict[tuple[str, str, bool], KernelSpec], dtypes: tuple[str, ...]
                ) -> dict[tuple[str, str, bool, str], QuickVerdict]:
        """Each kernel on the quick attention matrix in each timed dtype, before timing; a
        kernel timed gated (key's third element) on the matrix's cases made gated."""
        path = Path(self.case.verify)
        matrix = load_attention_matrix(path if path.suffix == ".toml"
                                       else builtin_case(self.case.verify))
        matrix = replace(matrix, dtypes=dtypes)
        out = {}
        for (name, mode, gated), spec in specs.items():
            for dtype in dtypes:
                cases = [_gated_case(c) if gated else c
                         for c in expand_attention(matrix, [spec.function], [dtype])]
                cases = [c for c in cases if given(spec, c)]
                records = [verify_attention_one(spec, prepare(c, mode, None, 128))
                           for c in cases]
                failed = [r for r in records if not r.passed]
                out[(name, mode, gated, dtype)] = QuickVerdict(
                    status="FAIL" if failed else "pass", cases=len(records), failed=len(failed),
                    max_ulp=max((r.max_ulp or 0.0 for r in records), default=0.0),
                    reason=failed[0].reason if failed else None)
        return out

    def _time(self, u: AttentionUnit, copy_bps: float, matmul_gflops: float,
              verdict: QuickVerdict) -> RunRecord:
        """One unit timed: its record, measured, or with the error that stopped it."""
        c, spec = self.case, u.spec
        shape = self.shape(u.length)
        params = {**c.row_params(spec.function, u.length), "causal": float(u.causal),
                  **({"padded": u.padded} if u.padded else {}),
                  **({"gate": 1.0} if u.gate else {})}
        record = RunRecord(kernel=spec.name, function=spec.function, backend=spec.backend,
                           source=spec.source, mode=spec.mode, dtype=u.dtype, shape=shape,
                           params=params, generator="normal", seed=c.seed, baseline=u.baseline,
                           wraps=wrapped_kernel(spec), verify=verdict)
        with launches.noting() as notes:
            self._measure(record, u, params, copy_bps, matmul_gflops)
        record.launch = launches.summary(notes)
        return record

    def _measure(self, record: RunRecord, u: AttentionUnit, params: dict[str, float],
                 copy_bps: float, matmul_gflops: float) -> None:
        """Time the unit's calls into its record, or set the error that stopped them."""
        c, spec, shape = self.case, u.spec, record.shape
        backend = get_backend(spec.backend)
        call = self._call(spec, AttentionCase(spec.function, "normal", shape, u.dtype,
                                              tuple(params.items()), c.seed),
                          self._mask(u.length, u.padded), u.gated)
        once = call if isinstance(call, Call) else guarded_call(
            backend, lambda: peak_growth(lambda: (call(0), backend.synchronize())))
        if once.raised is not None:
            record.error = once.error
            return
        assert not isinstance(call, Call)
        timing = time_calls(call, c.timing, backend.clock())
        _measured(record, timing, once.value, copy_bps, matmul_gflops, backend.llc_bytes(),
                  u.gated)

    def _call(self, spec: KernelSpec, case: AttentionCase, mask: np.ndarray | None,
              gated: bool = False) -> Callable[[int], Any] | Call:
        """What one timed call runs (the forward, or step(dO) after an untimed forward), or
        the failed forward call; mask is the key-padding mask, if any; gated: the kernel is
        given the case's gate (made here, outside the timed call, as q, k, v are)."""
        backend = get_backend(spec.backend)
        q, k, v = generate_qkv(case.generator, case.dtype, case.shape, case.seed)
        gate = generate_gate(case.generator, case.dtype, case.shape, case.seed) if gated \
            else None
        args, kw = kernel_arguments(spec, q, k, v, case.param_dict, case.dtype, case.scale,
                                    mask, gate)
        if spec.mode == "fwd":
            return lambda i: spec.fn(*args, **kw)
        shape = case.shape
        dout = backend.to_native(upstream_gradient(case, (*shape[:3], shape[4])))
        first = guarded_call(backend, spec.fn, *args, **kw)
        if first.raised is not None:
            return first
        step = backward_step(first.value)
        return lambda i: step(dout)


def _gated_case(case: AttentionCase) -> AttentionCase:
    """The case with its parameter gate set to 1 (kinds/attention/gating.py)."""
    params = dict(case.params)
    params["gate"] = 1.0  # in its place where the case names it, else last
    return replace(case, params=tuple(params.items()))


def _measured(record: RunRecord, timing: Timing, peak_bytes: int, copy_bps: float,
              matmul_gflops: float, llc_bytes: int, gated: bool = False) -> None:
    """Fill in a timed record: time, FLOP and byte rates against the two ceilings, memory
    (gated: the call took a gate, whose bytes count)."""
    shape, mode = record.shape, record.mode
    median = timing.stats.median_ns * 1e-9
    flops = attention_flops(*shape[:4], shape[4], bool(record.params["causal"]), mode)
    nbytes = attention_bytes(*shape[:4], shape[4], get_format(record.dtype).itemsize, mode,
                             gated)
    t_flop, t_mem = flops / (matmul_gflops * 1e9), nbytes / copy_bps
    record.compute_dtype = "fp64" if record.dtype == "fp64" else "fp32"
    record.cache = "in-cache" if nbytes <= llc_bytes // 2 else "out-of-cache"
    record.footprint_bytes = nbytes
    record.rotated_buffers = 1
    record.model = {"structure": "attention", "gemms": 2 if mode == "fwd" else 5,
                    "declared": False}
    record.model_bytes = float(nbytes)
    record.elements_per_s = shape[0] * shape[1] * shape[2] * shape[3] / median  # scores/s
    record.roof = {"flop_s": t_flop, "memory_s": t_mem, "matmul_gflops": matmul_gflops,
                   "copy_gbps": copy_bps / 1e9}
    record.min_bytes = nbytes
    record.timing = timing.to_record()
    record.median_s = median
    record.gbps = nbytes / median / 1e9
    record.pct_copy = 100 * t_mem / median
    record.flops = flops
    record.gflops = flops / median / 1e9
    record.pct_matmul = 100 * t_flop / median
    record.binding = "matmul" if t_flop >= t_mem else "memory"
    record.pct_roof = 100 * max(t_flop, t_mem) / median
    record.copy_gbps = copy_bps / 1e9
    record.peak_bytes = peak_bytes
