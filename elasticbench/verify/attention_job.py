"""Verifying attention kernels: the matrix, the call, the truth, the record, the job.

The matrix is the [attention_verify] table of a case file (cases/verify-attention.toml):

    [attention_verify]
    seed = 20261123
    dtypes = ["fp64", "fp32", "fp16", "bf16"]
    [attention_verify.params.elastic_attention]     # a grid per attention function
    tau = [0.01, 1, 10]
    beta = [0, 1]
    causal = [0, 1]
    [[attention_verify.inputs]]
    generator = "normal"                            # elasticbench.inputs.attention
    shapes = [[1, 2, 16, 16, 8]]                    # batch, heads, length_q, length_k, dim
    params.elastic_attention = { causal = [1] }     # optional, per input

Each case's exact truth is computed once for all its kernels (certified in double-double,
mpmath where that cannot decide, the mpmath part cached on disk by content:
numerics/attention_truth.py); every kernel call gets fresh copies of q, k, v (and dO), so
a kernel that writes its inputs is caught, and the record is a VerifyRecord whose shape is
the five sizes.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..attention.contract import backward_step, forward_output, kernel_arguments
from ..backends import get_backend
from ..execute import IN_PROCESS, Isolation, guarded_call
from ..functions import ATTENTION_FUNCTIONS, get_attention_function
from ..inputs.attention import Shape, generate_qkv, get_attention_generator
from ..inputs.generators import stream_seed
from ..numerics.attention_budget import ATTENTION_BUDGETS, Conditioning
from ..numerics.attention_truth import AttentionTruth, cached_evaluate
from ..numerics.dtypes import DTYPE_NAMES, check_dtypes, get_format
from ..numerics.truth_cache import TruthStats
from ..records import VerifyRecord
from ..registry import KernelSpec
from ..session import Job, Session
from .attention_check import check_backward, check_forward
from .check import CheckResult
from .matrix import CaseFileError, read_toml

TABLE = "attention_verify"


@dataclass(frozen=True)
class AttentionInputs:
    generator: str
    shapes: tuple[Shape, ...]
    params: dict[str, dict[str, list[float]]] = field(default_factory=dict)


@dataclass(frozen=True)
class AttentionMatrix:
    name: str
    seed: int
    dtypes: tuple[str, ...]
    params: dict[str, dict[str, list[float]]]
    inputs: tuple[AttentionInputs, ...]


@dataclass(frozen=True)
class AttentionCase:
    """One input of one attention function: the unit the reference is computed for."""

    function: str
    generator: str
    shape: Shape
    dtype: str
    params: tuple[tuple[str, float], ...]
    seed: int

    @property
    def param_dict(self) -> dict[str, float]:
        return dict(self.params)

    @property
    def scale(self) -> float:
        """SDPA's default, 1/sqrt(head_dim)."""
        return 1.0 / math.sqrt(self.shape[4])


def parse_attention_size(text: Any) -> Shape:
    """'BxHxLQxLKxD' (or a list of five) -> the five sizes, each >= 1."""
    parts = text if isinstance(text, list) else str(text).lower().replace("×", "x").split("x")
    try:
        values = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 5 or min(values) < 1 or any(isinstance(p, bool) for p in parts):
        raise ValueError(f"an attention size is BxHxLQxLKxD (batch, heads, query length, key "
                         f"length, head dim), each >= 1, like 1x2x16x16x8; got {text!r}")
    return values  # type: ignore[return-value]


def _grids(value: Any, where: str) -> dict[str, dict[str, list[float]]]:
    if not isinstance(value, dict):
        raise CaseFileError(f"{where}: params must be a table of attention functions")
    out = {}
    for fname, grid in value.items():
        try:
            fn = get_attention_function(fname)
            if not isinstance(grid, dict):
                raise ValueError(f"params.{fname} must map names to lists")
            lists = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
            fn.param_grid(lists)
        except ValueError as e:
            raise CaseFileError(f"{where}: {e}") from None
        out[fname] = lists
    return out


def load_attention_matrix(path: Path) -> AttentionMatrix:
    """Read and validate the [attention_verify] table of a case file."""
    table = read_toml(path).get(TABLE)
    where = str(path)
    if not isinstance(table, dict):
        raise CaseFileError(f"{where}: no [{TABLE}] table (attention kernels are verified on "
                            f"an attention matrix, like cases/verify-attention.toml)")
    try:
        dtypes = check_dtypes(table.get("dtypes", DTYPE_NAMES))
    except ValueError as e:
        raise CaseFileError(f"{where}: {e}") from None
    inputs = []
    for i, item in enumerate(table.get("inputs", [])):
        w = f"{where}: inputs[{i}]"
        if not isinstance(item, dict) or "generator" not in item:
            raise CaseFileError(f"{w}: needs a generator name")
        try:
            get_attention_generator(item["generator"])
            shapes = tuple(parse_attention_size(s) for s in item.get("shapes", []))
        except ValueError as e:
            raise CaseFileError(f"{w}: {e}") from None
        if not shapes:
            raise CaseFileError(f"{w}: needs at least one shape")
        inputs.append(AttentionInputs(item["generator"], shapes,
                                      _grids(item.get("params", {}), w)))
    if not inputs:
        raise CaseFileError(f"{where}: [{TABLE}] lists no inputs")
    seed = table.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise CaseFileError(f"{where}: seed must be a whole number")
    return AttentionMatrix(Path(path).stem, seed, dtypes, _grids(table.get("params", {}), where),
                           tuple(inputs))


def expand_attention(matrix: AttentionMatrix, functions: list[str],
                     dtypes: list[str] | None = None, generators: list[str] | None = None,
                     sizes: list[Shape] | None = None,
                     params: dict[str, float] | None = None) -> list[AttentionCase]:
    """Every case of the matrix for these functions, as verify.matrix.expand does for rows."""
    cases = []
    for fname in functions:
        fn = ATTENTION_FUNCTIONS[fname]
        fixed = {k: [v] for k, v in (params or {}).items() if k in fn.param_names}
        for spec in matrix.inputs:
            if generators and spec.generator not in generators:
                continue
            grid = fn.param_grid({**(spec.params.get(fname, matrix.params.get(fname)) or {}),
                                  **fixed})
            for shape in sizes or spec.shapes:
                for dtype in matrix.dtypes:
                    if dtypes and dtype not in dtypes:
                        continue
                    cases += [AttentionCase(fname, spec.generator, shape, dtype,
                                            tuple(c.items()), matrix.seed) for c in grid]
    return cases


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


def call_attention(spec: KernelSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                   params: dict[str, float], dtype: str, scale: float,
                   dout: np.ndarray | None) -> AttentionOutcome:
    """Run spec on fresh native copies by the contract (attention/contract.py): the forward's
    out, or step(dO)'s gradients, brought back as NumPy arrays."""
    backend = get_backend(spec.backend)
    args, kw = kernel_arguments(spec, q, k, v, params, dtype, scale)

    def run() -> Any:
        value = spec.fn(*args, **kw)
        if dout is None:
            return [forward_output(value)]
        return list(backward_step(value)(backend.to_native(dout)))

    call = guarded_call(backend, run)
    if call.raised is not None:
        return AttentionOutcome(None, call.error, False, call.seconds, call.raised,
                                call.warnings)
    modified = any(not np.array_equal(backend.to_numpy(n).view(np.uint8), a.view(np.uint8))
                   for n, a in zip(args, (q, k, v), strict=True))
    want = 1 if dout is None else 3 + len(get_attention_function(spec.function).row_params)
    if len(call.value) != want:
        return AttentionOutcome(None, f"step(dout) must return {want} gradients, got "
                                f"{len(call.value)}", modified, call.seconds,
                                warnings=call.warnings)
    try:
        outputs = [np.array(backend.to_numpy(t), copy=True) for t in call.value]
    except TypeError as e:
        return AttentionOutcome(None, f"returned the wrong type: {e}", modified, call.seconds,
                                warnings=call.warnings)
    return AttentionOutcome(outputs, None, modified, call.seconds, warnings=call.warnings)


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
    cond: Conditioning


def prepare(case: AttentionCase, mode: str, cache_dir: Path | None,
            precision: int, stats: TruthStats | None = None) -> PreparedCase:
    """Inputs, upstream gradient, exact truth and conditioning of one case (stats counts
    the truth's values and those mpmath computed)."""
    fn = get_attention_function(case.function)
    fmt = get_format(case.dtype)
    q, k, v = generate_qkv(case.generator, case.dtype, case.shape, case.seed)
    dout = upstream_gradient(case, (*q.shape[:3], v.shape[3])) if mode == "bwd" else None
    f64 = [a.astype(np.float64) for a in (q, k, v)]
    truth = cached_evaluate(cache_dir, fn, case.param_dict, *f64, case.scale,
                            None if dout is None else dout.astype(np.float64), precision,
                            fmt, stats)
    cond = Conditioning(fn, case.param_dict, *f64, case.scale, truth, fmt,
                        ATTENTION_BUDGETS[case.dtype])
    return PreparedCase(case, q, k, v, dout, truth, cond)


def verify_attention_one(spec: KernelSpec, prep: PreparedCase,
                         isolation: Isolation = IN_PROCESS, scale: float = 1.0) -> VerifyRecord:
    """Run one attention kernel on one case and return its record (allowances times
    scale)."""
    case, fmt = prep.case, get_format(prep.case.dtype)
    outcome = isolation.run(partial(call_attention, spec, prep.q, prep.k, prep.v,
                                    case.param_dict, case.dtype, case.scale, prep.dout),
                            _failed)
    checks: dict[str, Any] = {}
    if outcome.outputs is None:
        verdict = CheckResult(False, outcome.error or "no output")
    elif prep.dout is None:
        verdict = check_forward(outcome.outputs[0], prep.truth, prep.cond, fmt, scale)
    else:
        # c_i = dO_i . out_i uses the output a model saved: the exact one, in the format
        saved = fmt.cast(np.nan_to_num(prep.truth.out_hi)).astype(np.float64)
        verdict, checks = check_backward(outcome.outputs, prep.truth, prep.cond,
                                         get_attention_function(case.function),
                                         prep.dout.astype(np.float64), saved, fmt, scale)
    reason = verdict.reason
    if outcome.modified_input:
        reason = "; ".join(["modified its input"] + ([reason] if reason else []))
    b, h, lq = case.shape[:3]
    record = VerifyRecord(
        kernel=spec.name, function=spec.function, backend=spec.backend, source=spec.source,
        mode=spec.mode, dtype=case.dtype, input=case.generator, seed=case.seed,
        shape=case.shape, params=case.param_dict, rows_checked=b * h * lq,
        budget=ATTENTION_BUDGETS[case.dtype].to_dict(), budget_scale=scale,
        seconds=outcome.seconds,
        passed=verdict.passed and not outcome.modified_input, reason=reason,
        max_ulp=verdict.max_ulp, max_budget_frac=verdict.max_budget_frac,
        special_ok=verdict.special_ok, worst=verdict.worst, failures=verdict.failures,
        raised=outcome.raised, warnings=outcome.warnings or None,
        env=get_backend(spec.backend).environment() or None)
    if prep.dout is not None:
        record.dparams = {n: c.to_dict() for n, c in checks.items()}
        rels = [c.rel_err for c in checks.values() if math.isfinite(c.rel_err)]
        record.max_param_rel = max(rels) if rels else None
    return record


def attention_case_key(spec: KernelSpec, case: AttentionCase) -> tuple:
    """The record_key the record of spec on case will have."""
    from ..records import record_key

    return record_key({"kernel": spec.name, "mode": spec.mode, "dtype": case.dtype,
                       "input": case.generator, "shape": list(case.shape),
                       "params": case.param_dict, "seed": case.seed})


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
        m, c = item
        return (m, c.function, c.dtype, c.generator, list(c.shape), c.param_dict, c.seed)

    def _todo(self, mode: str, case: AttentionCase, done: set) -> list[KernelSpec]:
        return [k for k in self.kernels.get(mode, []) if k.function == case.function
                and k.supports(case.dtype) and attention_case_key(k, case) not in done]

    def work(self, items: list[tuple[str, AttentionCase]], session: Session) -> None:
        done = {r.key for r in session.records}
        todo = [(m, c, ks) for m, c in items if (ks := self._todo(m, c, done))]
        references = session.task("reference", len(todo))
        checks = session.task("kernels", sum(len(ks) for _, _, ks in todo))
        stats = TruthStats()
        for mode, case, specs in todo:
            prep = prepare(case, mode, self.cache_dir, self.precision, stats)
            references.advance()
            for spec in specs:
                session.add(verify_attention_one(spec, prep, self.isolation, self.scale))
                checks.advance()
        session.header["reference"] = stats.to_dict()
