"""Verifying attention kernels: the call, the truth, the record, the job (the matrix and its
cases are kinds/attention/verify_matrix.py).

Each case's exact truth is computed once for all its kernels (certified in double-double,
mpmath where that cannot decide, the mpmath part cached on disk by content:
numerics/truth/attention_truth.py); every kernel call gets fresh copies of q, k, v (and dO), so
a kernel that writes its inputs is caught, and the record is a VerifyRecord whose shape is
the five sizes.

A kernel is judged by what it declares: its accuracy contract (`wide`, or `own` for a
16-bit kernel that computes in its format: numerics/budgets/attention_own.py) and its causal
convention (`top_left` or `bottom_right`: where the causal diagonal lies when length_q !=
length_k; the reference follows it). A causal case it fails where the two conventions
differ is judged again under the other one, and if it passes there the failure says so.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from elasticbench.harness.backends import get_backend
from elasticbench.harness.execute import IN_PROCESS, Isolation, guarded_call, modified_reason
from elasticbench.harness.functions import get_attention_function
from elasticbench.harness.inputs.generators import stream_seed
from elasticbench.harness.kinds.attention.gating import (
    case_gate,
    check_gated_forward,
    dgate_score,
    is_gated,
    takes_gate,
    truth_params,
)
from elasticbench.harness.kinds.attention.kernel_contract import (
    TOP_LEFT,
    backward_step,
    causal_reference,
    conventions_differ,
    forward_output,
    kernel_arguments,
    mask_argument,
    other_convention,
    own_params,
)
from elasticbench.harness.kinds.attention.qkv_inputs import generate_mask, generate_qkv, mask_bias
from elasticbench.harness.kinds.attention.scoring import check_backward, check_forward
from elasticbench.harness.kinds.attention.verify_matrix import AttentionCase
from elasticbench.harness.numerics.budgets.attention_budgets import ATTENTION_BUDGETS, Conditioning
from elasticbench.harness.numerics.budgets.attention_own import (
    attention_budget,
    conditioning,
    differs,
)
from elasticbench.harness.numerics.contract import Judging
from elasticbench.harness.numerics.dtypes import FloatFormat, get_format
from elasticbench.harness.numerics.truth.attention_truth import AttentionTruth, cached_evaluate
from elasticbench.harness.numerics.truth.cache import TruthStats
from elasticbench.harness.numerics.truth.row_truth import DEFAULT_PRECISION
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.session import Job, Session
from elasticbench.harness.verify.case import case_key, shard_key
from elasticbench.harness.verify.check import CheckResult
from elasticbench.harness.verify.record import verify_record
from elasticbench.harness.verify.second_order import second_order


def upstream_gradient(case: AttentionCase, shape: tuple[int, ...]) -> np.ndarray:
    """The seeded dO of a case: N(0, 1) in the case's format."""
    seed = [*stream_seed(case.seed, f"attention/{case.generator}", case.dtype, case.shape),
            zlib.crc32(b"upstream")]
    return get_format(case.dtype).cast(np.random.default_rng(seed).standard_normal(shape))


@dataclass
class AttentionOutcome:
    """What one call of an attention kernel gave: out, or the gradients (NumPy)."""

    outputs: list[np.ndarray] | None
    error: str | None
    modified_input: bool
    seconds: float
    raised: dict[str, Any] | None = None
    warnings: list[dict[str, Any]] = field(default_factory=list)
    modified_args: list[str] = field(default_factory=list)  # the tensors it wrote to, named


def _tensor_arguments(args: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    """Every array argument of a call by its name: q, k, v, the row parameters and the
    mask (scale and causal are plain Python values)."""
    named = dict(zip(("q", "k", "v"), args, strict=True))
    named.update({n: a for n, a in kw.items() if not isinstance(a, bool | int | float)})
    return named


def _bits(backend: Any, a: Any) -> np.ndarray:
    """A copy of a native array's bytes (a CPU tensor's NumPy view shares its memory)."""
    return np.array(np.asarray(backend.to_numpy(a)).view(np.uint8), copy=True)


def call_attention(spec: KernelSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                   params: dict[str, float], dtype: str, scale: float,
                   dout: np.ndarray | None, mask: np.ndarray | None = None,
                   gate: np.ndarray | None = None) -> AttentionOutcome:
    """Run spec on fresh native copies by the contract (kernel_contract.py): the forward's
    out, or step(dO)'s gradients (d gate last in a gated case), brought back as NumPy
    arrays."""
    backend = get_backend(spec.backend)
    args, kw = kernel_arguments(spec, q, k, v, params, dtype, scale, mask, gate)
    tensors = _tensor_arguments(args, kw)
    if dout is not None:
        tensors["dout"] = backend.to_native(dout)
    before = {n: _bits(backend, a) for n, a in tensors.items()}

    def run() -> Any:
        value = spec.fn(*args, **kw)
        if dout is None:
            return [forward_output(value)]
        return list(backward_step(value)(tensors["dout"]))

    call = guarded_call(backend, run)
    if call.raised is not None:
        return AttentionOutcome(None, call.error, False, call.seconds, call.raised,
                                call.warnings)
    wrote = [n for n, a in tensors.items() if not np.array_equal(_bits(backend, a), before[n])]
    modified = bool(wrote)
    want = 1 if dout is None else (3 + len(get_attention_function(spec.function).row_params)
                                   + (gate is not None))
    if len(call.value) != want:
        return AttentionOutcome(None, f"step(dout) must return {want} gradients, got "
                                f"{len(call.value)}", modified, call.seconds,
                                warnings=call.warnings, modified_args=wrote)
    try:
        outputs = [np.array(backend.to_numpy(t), copy=True) for t in call.value]
    except TypeError as e:
        return AttentionOutcome(None, f"returned the wrong type: {e}", modified, call.seconds,
                                warnings=call.warnings, modified_args=wrote)
    return AttentionOutcome(outputs, None, modified, call.seconds, warnings=call.warnings,
                            modified_args=wrote)


def _failed(reason: str, seconds: float) -> AttentionOutcome:
    return AttentionOutcome(None, reason, False, seconds)


@dataclass
class PreparedCase:
    case: AttentionCase
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dout: np.ndarray | None
    truth: AttentionTruth
    cond: Conditioning  # the wide contract's
    mask: np.ndarray | None = None  # the input's attn_mask (qkv_inputs.generate_mask)
    causal: str = TOP_LEFT  # the convention the truth follows (top-left where they agree)
    ref_params: dict[str, float] | None = None  # what the truth took (None: the case's)
    ref_bias: np.ndarray | None = None  # and its mask as a bias (-inf: hidden)
    _conds: dict[str, Conditioning] = field(default_factory=dict, repr=False)
    gate: np.ndarray | None = None  # a gated case's gate (kinds/attention/gating.py)
    upstream: np.ndarray | None = None  # the truth's dO: dout, times the gate where gated

    def conditioning(self, accuracy: str) -> Conditioning:
        """The allowances' terms under a kernel's contract (own: built once, then kept)."""
        fmt = get_format(self.case.dtype)
        if not differs(fmt, accuracy):
            return self.cond
        if accuracy not in self._conds:
            f64 = [a.astype(np.float64) for a in (self.q, self.k, self.v)]
            self._conds[accuracy] = conditioning(
                get_attention_function(self.case.function),
                self.ref_params or self.case.param_dict, *f64, self.case.scale, self.truth,
                fmt, accuracy, self.ref_bias)
        return self._conds[accuracy]


def judged_convention(spec: KernelSpec, case: AttentionCase) -> str:
    """The causal convention spec is judged by on case: its own where the two differ
    there, else top-left (one truth serves every kernel)."""
    return spec.causal if conventions_differ(case.shape, case.param_dict) else TOP_LEFT


def prepare(case: AttentionCase, mode: str, cache_dir: Path | None,
            precision: int, stats: TruthStats | None = None,
            causal: str = TOP_LEFT) -> PreparedCase:
    """Inputs, upstream gradient, exact truth and conditioning of one case (stats counts
    the truth's values and those mpmath computed), the truth under the causal convention
    `causal` (kinds.attention.kernel_contract.causal_reference)."""
    fn = get_attention_function(case.function)
    fmt = get_format(case.dtype)
    q, k, v = generate_qkv(case.generator, case.dtype, case.shape, case.seed)
    mask = generate_mask(case.generator, case.dtype, case.shape, case.seed)
    params, bias = causal_reference(case.param_dict, case.shape,
                                    mask_bias(mask, case.shape), causal)
    dout = upstream_gradient(case, (*q.shape[:3], v.shape[3])) if mode == "bwd" else None
    gate = case_gate(case)  # a gated case's truth is the ungated one (dO = dY * g)
    upstream = None if dout is None else dout.astype(np.float64) * (
        1.0 if gate is None else gate.astype(np.float64))
    f64 = [a.astype(np.float64) for a in (q, k, v)]
    truth = cached_evaluate(cache_dir, fn, truth_params(params), *f64, case.scale,
                            upstream, precision,
                            fmt, stats, bias)
    cond = Conditioning(fn, params, *f64, case.scale, truth, fmt,
                        ATTENTION_BUDGETS[case.dtype], bias)
    effective = causal if conventions_differ(case.shape, case.param_dict) else TOP_LEFT
    prep = PreparedCase(case, q, k, v, dout, truth, cond, mask, effective, params, bias)
    prep.gate, prep.upstream = gate, upstream
    return prep


def _judge(outcome: AttentionOutcome, prep: PreparedCase, fmt: FloatFormat, scale: float,
           accuracy: str) -> tuple[CheckResult, dict[str, Any]]:
    """The verdict on what the kernel gave, and the parameters' gradient checks (backward),
    every allowance that of the kernel's contract times the run's budget scale."""
    assert outcome.outputs is not None
    cond = prep.conditioning(accuracy)
    if prep.gate is not None:
        return _judge_gated(outcome, prep, fmt, scale, cond)
    if prep.dout is None:
        return check_forward(outcome.outputs[0], prep.truth, cond, fmt, scale), {}
    # c_i = dO_i . out_i uses the output a model saved: the exact one, in the format
    saved = fmt.cast(np.nan_to_num(prep.truth.out_hi)).astype(np.float64)
    return check_backward(outcome.outputs, prep.truth, cond,
                          get_attention_function(prep.case.function),
                          prep.dout.astype(np.float64), saved, fmt, scale)



def _judge_gated(outcome: AttentionOutcome, prep: PreparedCase, fmt: FloatFormat,
                 scale: float, cond: Conditioning) -> tuple[CheckResult, dict[str, Any]]:
    """A gated case's verdict (kinds/attention/gating.py): Y against out * g; the gradients
    against the ungated ones for dO = dY * g, and d gate against dY * out."""
    assert outcome.outputs is not None and prep.gate is not None
    if prep.dout is None:
        return check_gated_forward(outcome.outputs[0], prep.truth, cond, fmt, prep.gate,
                                   scale), {}
    dg = dgate_score(outcome.outputs[-1], prep.truth, cond, fmt,
                     prep.dout.astype(np.float64), scale)
    if isinstance(dg, CheckResult):
        return dg, {}
    saved = fmt.cast(np.nan_to_num(prep.truth.out_hi)).astype(np.float64)
    return check_backward(outcome.outputs[:-1], prep.truth, cond,
                          get_attention_function(prep.case.function), prep.upstream, saved,
                          fmt, scale, rounded_dout=True, extra=(dg,))


def convention_hint(spec: KernelSpec, prep: PreparedCase, outcome: AttentionOutcome,
                    scale: float) -> str:
    """Where a causal case the kernel failed would pass under the other causal convention
    (the lengths differ), the words that say so; else ''."""
    if outcome.outputs is None or not conventions_differ(prep.case.shape,
                                                         prep.case.param_dict):
        return ""
    other = other_convention(prep.causal)
    there = prepare(prep.case, "fwd" if prep.dout is None else "bwd", None,
                    DEFAULT_PRECISION, causal=other)
    verdict, _ = _judge(outcome, there, get_format(prep.case.dtype), scale, spec.accuracy)
    if not verdict.passed:
        return ""
    return (f"passes under causal={other!r}: declare it in the kernel's contract "
            f"(register_kernel(..., causal={other!r}))")


def verify_attention_one(spec: KernelSpec, prep: PreparedCase,
                         isolation: Isolation = IN_PROCESS, scale: float = 1.0) -> VerifyRecord:
    """Run one attention kernel on one case and return its record (allowances times
    scale). A kernel taking its parameters in its own format is judged on the case with
    them rounded (kernel_case), and one whose causal convention differs from prep's on
    this case against that convention's truth: each prepared here if prep is not it."""
    own = kernel_case(spec, prep.case)
    convention = judged_convention(spec, own)
    if own is not prep.case or convention != prep.causal:
        prep = prepare(own, "fwd" if prep.dout is None else "bwd", None, DEFAULT_PRECISION,
                       causal=convention)
    case, fmt = prep.case, get_format(prep.case.dtype)
    outcome = isolation.run(partial(call_attention, spec, prep.q, prep.k, prep.v,
                                    case.param_dict, case.dtype, case.scale, prep.dout,
                                    prep.mask, prep.gate),
                            _failed)
    verdict, checks = (_judge(outcome, prep, fmt, scale, spec.accuracy)
                       if outcome.outputs is not None else (None, {}))
    if (verdict is not None and not verdict.passed and not outcome.modified_input
            and (hint := convention_hint(spec, prep, outcome, scale))):
        verdict = replace(verdict, reason=f"{verdict.reason}; {hint}")
    b, h, lq = case.shape[:3]
    record = verify_record(spec, case, outcome, verdict,
                           budget=attention_budget(fmt, spec.accuracy).to_dict(),
                           judging=Judging(spec.accuracy, scale),
                           rows_checked=b * h * lq,
                           broken=[modified_reason(outcome.modified_args or ["q"])]
                           if outcome.modified_input else None)
    record.causal = spec.causal
    if prep.dout is not None:
        record.dparams = {n: c.to_dict() for n, c in checks.items()}
        rels = [c.rel_err for c in checks.values() if math.isfinite(c.rel_err)]
        record.max_param_rel = max(rels) if rels else None
        record.second_order = second_order(spec, isolation)
    return record


def given(spec: KernelSpec, case: AttentionCase) -> bool:
    """Whether a kernel is given this case at all (verify, the selftest and run's quick
    verification alike): its function and dtype, a mask it declares a parameter for, and a
    gated case only where it declares `gate`."""
    if spec.function != case.function or not spec.supports(case.dtype):
        return False
    if is_gated(case) and not takes_gate(spec):
        return False
    mask = generate_mask(case.generator, case.dtype, case.shape, case.seed)
    return mask_argument(spec, mask) is not None


def kernel_case(spec: KernelSpec, case: AttentionCase) -> AttentionCase:
    """The case as spec is judged on: for a kernel taking its row parameters in its own
    format (param_form "own"), the parameters rounded to the case's dtype, which it is
    given and the reference then uses (the record's params say so); else case itself."""
    if spec.param_form != "own":
        return case
    rounded = own_params(case.param_dict, get_attention_function(case.function).row_params,
                         case.dtype)
    return case if rounded == case.param_dict else replace(case,
                                                          params=tuple(rounded.items()))


class AttentionVerifyJob(Job[tuple[str, AttentionCase]]):
    """Items are (mode, case): each case's truth is computed once for all its kernels."""

    kind = "verify"

    def __init__(self, kernels: dict[str, list[KernelSpec]],
                 cases: dict[str, list[AttentionCase]], *, cache_dir: Path | None,
                 precision: int, isolation: Isolation, scale: float = 1.0):
        self.kernels, self.cases = kernels, cases
        self.cache_dir, self.precision, self.isolation = cache_dir, precision, isolation
        self.scale = scale

    def plan(self) -> list[tuple[str, AttentionCase]]:
        return [(m, c) for m, cases in self.cases.items() for c in cases]

    def shard_key(self, item: tuple[str, AttentionCase]) -> Any:
        return shard_key(*item)

    def _todo(self, mode: str, case: AttentionCase, done: set) -> list[KernelSpec]:
        return [k for k in self.kernels.get(mode, []) if given(k, case)
                and case_key(k, kernel_case(k, case)) not in done]

    def work(self, items: list[tuple[str, AttentionCase]], session: Session) -> None:
        done = {r.key for r in session.records}
        todo = [(m, c, ks) for m, c in items if (ks := self._todo(m, c, done))]
        references = session.task("reference", len(todo))
        checks = session.task("kernels", sum(len(ks) for _, _, ks in todo))
        stats = TruthStats()
        for mode, case, specs in todo:
            prep = prepare(case, mode, self.cache_dir, self.precision, stats)
            references.advance()
            # a kernel given rounded parameters is judged against their own reference, and
            # one of the other causal convention against that convention's
            preps = {(case, TOP_LEFT): prep}
            for spec in specs:
                own = kernel_case(spec, case)
                key = (own, judged_convention(spec, own))
                if key not in preps:
                    preps[key] = prepare(own, mode, self.cache_dir, self.precision, stats,
                                         causal=key[1])
                session.add(verify_attention_one(spec, preps[key], self.isolation,
                                                 self.scale))
                checks.advance()
        session.header["reference"] = stats.to_dict()
