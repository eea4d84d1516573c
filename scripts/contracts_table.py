"""The 16-bit example kernels (examples/own_format16.py) judged by both accuracy contracts on
a verification matrix: cases, failed, worst error in ulps and worst share of the budget.

    .venv/bin/python scripts/contracts_table.py            # the default matrix (about 1 min)
    .venv/bin/python scripts/contracts_table.py verify-quick

The outputs are the same under both contracts; only the budgets that judge them differ
(docs/numerics.md section 3.1 has the table this prints).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from elasticbench.harness.numerics.contract import OWN, WIDE
from elasticbench.harness.numerics.truth.cache import TruthStore, default_cache_dir
from elasticbench.harness.records import VerifyRecord
from elasticbench.harness.registry import load_kernel_file
from elasticbench.harness.verify.matrix import builtin_case, expand, load_matrix
from elasticbench.harness.verify.verifier import run_verification

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "own_format16.py"
KERNELS = ("own16_elastic", "own16_softmax1")


def main() -> None:
    """Print one markdown row per contract, kernel and dtype."""
    matrix = load_matrix(builtin_case(sys.argv[1] if len(sys.argv) > 1 else "verify"))
    store = TruthStore(default_cache_dir())
    specs = [s for s in load_kernel_file(EXAMPLE) if s.name in KERNELS]
    print("| contract | kernel | dtype | cases | failed | worst ulp | worst share |")
    print("|---|---|---|---:|---:|---:|---:|")
    for accuracy in (OWN, WIDE):
        for spec in specs:
            for dtype in ("fp16", "bf16"):
                records: list[VerifyRecord] = []
                run_verification([replace(spec, accuracy=accuracy)],
                                 expand(matrix, [spec.function], [dtype]),
                                 max_elements=matrix.max_elements, store=store,
                                 on_record=records.append, max_rows=matrix.max_rows)
                failed = sum(r.failed for r in records)
                ulp = max(r.max_ulp or 0.0 for r in records)
                share = max(r.max_budget_frac or 0.0 for r in records)
                print(f"| {accuracy} | {spec.name} | {dtype} | {len(records)} | {failed} | "
                      f"{ulp:.3g} | {share:.2f} |")


if __name__ == "__main__":
    main()
