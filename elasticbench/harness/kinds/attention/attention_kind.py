"""Attention kernels (q, k, v; docs/attention.md): the [attention_verify] matrix,
BxHxLQxLKxD sizes, the [attention_run] case timed against SDPA and the copy and matmul
ceilings."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from elasticbench.harness.backends import device_of
from elasticbench.harness.bench.runner import set_threads
from elasticbench.harness.environment import describe
from elasticbench.harness.functions import ATTENTION, AttentionFunction, get_attention_function
from elasticbench.harness.kinds.attention.mutant_kernels import (
    ATTENTION_CONTROL,
    ATTENTION_MUTANTS,
    run_attention_selftest,
)
from elasticbench.harness.kinds.attention.qkv_inputs import get_attention_generator
from elasticbench.harness.kinds.attention.run_case import TABLE as RUN_TABLE
from elasticbench.harness.kinds.attention.run_case import load_attention_run
from elasticbench.harness.kinds.attention.run_job import AttentionRunJob
from elasticbench.harness.kinds.attention.verify_job import AttentionVerifyJob
from elasticbench.harness.kinds.attention.verify_matrix import (
    expand_attention,
    load_attention_matrix,
    parse_attention_size,
)
from elasticbench.harness.kinds.kind import Kind, RunOptions, VerifyOptions, no_cases
from elasticbench.harness.numerics.truth.cache import default_cache_dir
from elasticbench.harness.registry import KernelSpec, get_kernel
from elasticbench.harness.selftest.outcomes import SelftestOutcome
from elasticbench.harness.verify.matrix import builtin_case


class Attention(Kind):
    """Kernels that take q, k, v (docs/attention.md section 4)."""

    name = ATTENTION
    matrix, quick_matrix, run_table = "verify-attention", "verify-attention-quick", RUN_TABLE

    def function(self, name: str) -> AttentionFunction:
        return get_attention_function(name)

    def verify_job(self, path: Path, kernels: dict[str, list[KernelSpec]],
                   options: VerifyOptions) -> AttentionVerifyJob:
        for g in options.inputs:
            get_attention_generator(g)
        shapes = [parse_attention_size(v) for v in options.sizes]
        matrix = load_attention_matrix(path)
        cases = {m: expand_attention(matrix, sorted({k.function for k in ks}),
                                     options.dtypes or None, options.inputs or None,
                                     shapes or None, options.params)
                 for m, ks in kernels.items()}
        if not any(cases.values()):
            raise no_cases(path)
        return AttentionVerifyJob(kernels, cases,
                                  cache_dir=None if options.no_cache else default_cache_dir(),
                                  precision=options.precision, isolation=options.isolation,
                                  scale=options.scale)

    def run_job(self, path: Path, options: RunOptions) -> tuple[AttentionRunJob, dict[str, Any]]:
        case = load_attention_run(path)
        threads = set_threads(0)
        specs = [get_kernel(n, m) for n in (*case.kernels, *filter(None, [case.baseline]))
                 for m in case.modes]
        device = device_of([s.backend for s in specs])
        meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "case": str(path),
                "case_name": case.name, "mode": ",".join(case.modes), "seed": case.seed,
                "threads": threads, "dtypes": list(case.dtypes),
                "sizes": [[case.batch, case.heads, n, n, case.head_dim] for n in case.lengths],
                "baseline": case.baseline, "policy": case.timing.__dict__, **describe()}
        return AttentionRunJob(case, device), meta

    def selftest(self, correct: list[KernelSpec], cache: Path | None) -> list[SelftestOutcome]:
        matrix = load_attention_matrix(builtin_case(self.quick_matrix))
        return run_attention_selftest(ATTENTION_MUTANTS, [ATTENTION_CONTROL, *correct], matrix,
                                      cache)


ATTENTION_KIND = Attention()
