"""The record of one timed cell of `run`: a kernel on a dtype and a size, with its verdict.

A record is finished when it is emitted: its quick-verification verdict, whether it is
ranked and its speedup over the baseline of its cell are set by the bench layer, and nothing
reworks it later. A kernel that raised has `error` and none of the measured fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from elasticbench.harness.records.fields import (
    JSONRecord,
    RecordError,
    duration_ns,
    duration_s,
    entry,
    nonnegative,
    positive,
    timed_names,
)
from elasticbench.harness.records.identity import Identified, KernelCase

Status = Literal["pass", "FAIL", "unverified"]


@dataclass(kw_only=True)
class TimingRecord(JSONRecord):
    """Raw samples (ns per call) and their summary; A/B files keep the samples alone."""

    samples_ns: list[float] = entry(check=duration_ns)
    inner: int | None = entry(None, check=positive)
    median_ns: float | None = entry(None, check=duration_ns)
    q1_ns: float | None = entry(None, check=duration_ns)
    q3_ns: float | None = entry(None, check=duration_ns)
    iqr_ns: float | None = entry(None, check=duration_ns)
    min_ns: float | None = entry(None, check=duration_ns)
    spread: float | None = entry(None, nonfinite=True)  # IQR / median; inf for a 0 median
    reps: int | None = entry(None, check=nonnegative)
    converged: bool | None = None
    clock: str | None = None
    warning: str | None = None
    paired: bool | None = None  # A/B: samples interleaved with the other version's
    processes: list[int] | None = entry(None, check=positive)  # samples of each process, in order

    def __post_init__(self) -> None:
        if not self.samples_ns:
            raise RecordError("samples_ns", "must hold at least one sample")
        if self.processes is not None and sum(self.processes) != len(self.samples_ns):
            raise RecordError("processes", f"counts {sum(self.processes)} samples, "
                              f"samples_ns holds {len(self.samples_ns)}")


@dataclass(kw_only=True)
class QuickVerdict(JSONRecord):
    """What the quick verification said of a (kernel, dtype) before it was timed."""

    status: Status
    cases: int | None = entry(None, check=nonnegative)
    failed: int | None = entry(None, check=nonnegative)
    max_ulp: float | None = entry(None, nonfinite=True)
    reason: str | None = None

    @property
    def passed(self) -> bool | None:
        """True: passed; False: failed; None: not verified."""
        return {"pass": True, "FAIL": False}.get(self.status)


@dataclass(kw_only=True)
class RunRecord(KernelCase):
    """One timed (kernel, dtype, shape): identity, then the measurement, then the verdict."""

    version: str | None = None  # A/B files: "base" or "current"
    generator: str | None = None
    seed: int | None = None
    baseline: bool = False
    # the raw kernel this kernel's call runs on its device (an API kernel's, say: kernels/
    # row_ops.py, api_kernels.py), as the kernel declared it when the run executed; reports set its
    # median beside this record's as the `overhead` column
    wraps: str | None = None
    plan_position: int | None = entry(None, check=nonnegative)
    error: str | None = None  # the kernel raised (or crashed): nothing below was measured
    compute_dtype: str | None = entry(None, timed=True)
    cache: Literal["in-cache", "out-of-cache"] | None = entry(None, timed=True)
    footprint_bytes: int | None = entry(None, check=positive, timed=True)
    rotated_buffers: int | None = entry(None, check=positive, timed=True)
    model: dict[str, Any] | None = entry(None, timed=True)  # the kernel's PassModel
    min_bytes: int | None = entry(None, check=positive, timed=True)
    model_bytes: float | None = entry(None, check=positive, timed=True)
    timing: TimingRecord | None = entry(None, timed=True)
    median_s: float | None = entry(None, check=duration_s, timed=True)
    elements_per_s: float | None = entry(None, check=positive, timed=True)
    gbps: float | None = entry(None, check=positive, timed=True)
    pct_copy: float | None = entry(None, check=positive, timed=True)
    roof: dict[str, Any] | None = entry(None, timed=True)  # the Roof it was measured against
    binding: Literal["memory", "exp", "matmul"] | None = entry(None, timed=True)
    pct_roof: float | None = entry(None, check=positive, timed=True)
    copy_gbps: float | None = entry(None, check=positive)  # the copy roof of its own run
    # attention (docs/attention.md section 6): model FLOPs, achieved rate and its share of
    # the run's measured matmul ceiling, and the process's peak memory growth in one call
    flops: float | None = entry(None, check=positive)
    gflops: float | None = entry(None, check=positive)
    pct_matmul: float | None = entry(None, check=positive)
    peak_bytes: int | None = entry(None, check=nonnegative)
    # how the kernel launched what it ran, as its host code noted it (a Triton row plan,
    # attention tiles: elasticbench.launches); None where it notes nothing
    launch: str | None = None
    verify: QuickVerdict | None = None
    ranked: bool = False  # timed, verified and not the baseline: it competes
    speedup: float | None = entry(None, check=positive)  # baseline median / own median

    @property
    def generated_by(self) -> str | None:
        return self.generator

    @property
    def status(self) -> Status:
        """The quick verification's verdict: "unverified" when there was none."""
        return "unverified" if self.verify is None else self.verify.status

    def check_measured(self) -> None:
        """RecordError unless the record holds every timed field, or says why it has none
        (error): what tables and plots of timings are drawn from. (A/B files keep the
        samples alone, and gates read no more.)"""
        missing = [n for n in timed_names(type(self)) if getattr(self, n) is None]
        if missing and self.error is None:
            raise RecordError("", f"lacks {', '.join(missing)}")

    @property
    def cell(self) -> tuple[str, tuple[int, int], str]:
        """The cell a record competes in: its baseline is the baseline's record of it."""
        return (self.dtype, tuple(self.shape), self.mode)

    @property
    def unit(self) -> tuple[str, str, str, tuple[int, int]]:
        """Which planned unit this is a result for (kernel, mode, dtype, shape)."""
        return (self.kernel, self.mode, self.dtype, tuple(self.shape))

    @property
    def failed(self) -> bool:
        """A timed kernel (not the baseline) that raised or failed verification."""
        return not self.baseline and (
            self.error is not None or (self.verify is not None and self.verify.status == "FAIL"))


@dataclass(kw_only=True)
class NoiseFloorEntry(JSONRecord, Identified):
    """A baseline's noise floor for one timed series (docs/gates.md): the series' identity
    (IDENTITY_FIELDS, as its record has them) and, per metric, the spread of its processes'
    log medians within a run and the shift between runs, with their degrees of freedom."""

    kernel: str
    mode: Literal["fwd", "bwd"] = "fwd"
    dtype: str
    input: str | None = None
    shape: tuple[int, ...] = entry(check=positive)
    params: dict[str, float] = entry(factory=dict)
    seed: int | None = None
    layout: str | None = None
    sd_log: dict[str, float] = entry(check=nonnegative)
    df: int = entry(check=positive)
    run_sd_log: dict[str, float] = entry(factory=dict, check=nonnegative)
    run_df: int = entry(0, check=nonnegative)


@dataclass(kw_only=True)
class BenchmarkNoiseFloorEntry(JSONRecord):
    """A pytest-benchmark baseline's noise floor for one benchmark, named as the gate keys it
    (its fullname, else its name); the fields after it are NoiseFloorEntry's (each file of
    the baseline is one run of one process, docs/gates.md)."""

    benchmark: str
    sd_log: dict[str, float] = entry(check=nonnegative)
    df: int = entry(check=positive)
    run_sd_log: dict[str, float] = entry(factory=dict, check=nonnegative)
    run_df: int = entry(0, check=nonnegative)
