"""Whether a kernel compiles for the device it is written for, where running it cannot show it.

A backend whose kernels run here in an interpreter (Triton's, TRITON_INTERPRET=1) says so
(`Backend.interpreted`); the interpreter accepts code that the device's compiler rejects, so
verify compiles the calls of such kernels from kernel files for sm_90 and sm_80
(elasticbench.harness.audit.kernel_files) and a kernel that does not compile fails its cases. The
built-ins are audited in the test suite, and on a GPU the runs themselves compile.
"""

from __future__ import annotations

import subprocess
from typing import Any

from elasticbench.harness.audit.kernel_files import CallCheck, CallRequest, check_calls
from elasticbench.harness.backends import get_backend
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.verify.matrix import VerifyCase


def compile_checks(pairs: list[tuple[KernelSpec, VerifyCase]]) -> dict[tuple, CallCheck]:
    """call_key -> what compiling that call said, for the kernel files' kernels whose backend
    runs them in an interpreter here (it depends on the call's kernel, dtype, shape and
    parameters, not on the input's values, so each distinct call is asked once)."""
    calls = {call_key(spec, case): (spec, CallRequest(spec.name, spec.mode, case.dtype,
                                                      case.shape, case.param_dict))
             for spec, case in pairs
             if spec.source != "builtin" and get_backend(spec.backend).interpreted()}
    if not calls:
        return {}
    files = sorted({spec.source for spec, _ in calls.values()})
    try:
        checks = check_calls(files, [request for _, request in calls.values()])
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        checks = [CallCheck([], f"the compile check could not run: {e}")] * len(calls)
    return dict(zip(calls, checks, strict=True))


def call_key(spec: KernelSpec, case: VerifyCase) -> tuple:
    return (spec.name, spec.mode, case.dtype, case.shape, tuple(sorted(case.param_dict.items())))


def with_compile_check(record: VerifyRecord, check: Any) -> None:
    """Add what compiling said to a record; a kernel that does not compile fails the case."""
    record.compile = None if check is None else check.to_dict()
    failure = None if check is None else check.failure()
    if failure:
        record.passed = False
        record.reason = "; ".join([failure] + ([record.reason] if record.reason else []))
