"""The Triton row kernels under every launch plan worth trying, against the in-run copy: the
figures that set kernels/triton/launch.py's table (plan_rows) on a GPU.

    python scripts/gpu_rows_sweep.py OUT_DIR [--budget-s 240]

For each shape (cases/gpu.toml's, short rows, a backward row past its register limit), dtype
(fp32, bf16), direction (forward: triton_elastic and triton_softmax; backward:
triton_elastic) and plan (the table's, and each forced alternative that differs from it:
rows per program on short rows; on long rows the two-read split at each split count, one
program a row (online), and the single-read resident path at each programs-per-row count), it
times the kernel with triton.testing.do_bench (medians, L2 flushed) and
a device-to-device copy of the same input, and prints and writes (OUT_DIR/rows-sweep.json)
the share of the copy's bandwidth each reaches: forward (read x, write y) against the copy
of x (read, write); backward (read x, y, g, write dx) against twice it. It stops starting
new timings when the budget is spent. The plan recorded is the one the call took (a resident
launch the driver refuses falls back to the split path, and says so here). Without CUDA it
prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# the long-row target first: gpu_checks.sh gives the sweep a short budget, and a
# shape it does not reach is not timed at all
SHAPES = [(256, 262144), (512, 4096), (4096, 4096), (65536, 128), (16384, 512), (512, 16384)]
SPLITS = (1, 2, 4, 8, 16, 32)
RESIDENT_SPLITS = (8, 16, 32, 64, 128)
ROW_BLOCKS = (1, 2, 4, 8, 16, 32)


def alternatives(path: str) -> list[dict[str, int]]:
    """The launch options worth timing beside the table's plan on a row of this path."""
    if path in ("split", "online", "resident"):
        return ([{"splits": s, "resident": -1} for s in SPLITS]
                + [{"splits": s, "resident": 1} for s in RESIDENT_SPLITS])
    return [{"row_block": b} for b in ROW_BLOCKS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget-s", type=float, default=240.0)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_rows_sweep: no CUDA device, nothing timed")
        return 0
    from triton.testing import do_bench

    from elasticbench.kernels.triton.elastic_backward import elastic_backward
    from elasticbench.kernels.triton.exp_family import elastic_forward, softmax_forward
    from elasticbench.kernels.triton.launch import (
        PLANS,
        LaunchOptions,
        device_sms,
        launch_options,
        plan_rows,
        resident_available,
    )

    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    results: list[dict] = []
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    spent = False
    for rows, n in SHAPES:
        if spent or time.monotonic() - start > args.budget_s:
            print(f"budget spent: stopped before {rows}x{n}")
            break
        for dname, dtype in dtypes.items():
            x = torch.randn(rows, n, device="cuda").to(dtype)
            copy_ms = do_bench(lambda x=x: x.clone(), return_mode="median")
            for mode in ("fwd", "bwd"):
                limit = LaunchOptions().max_fused // (2 if mode == "bwd" else 1)
                table = plan_rows(rows, n, x.element_size(), LaunchOptions(), device_sms(x),
                                  max_fused=limit, resident=resident_available(x))
                forced = [{}, *alternatives(table.path)]
                if mode == "fwd":
                    calls = {"triton_elastic": lambda x=x: elastic_forward(x, 1.0, 1.0),
                             "triton_softmax": lambda x=x: softmax_forward(x)}
                else:
                    y = elastic_forward(x, 1.0, 1.0)
                    g = torch.randn_like(x)
                    calls = {"triton_elastic":
                             lambda x=x, y=y, g=g: elastic_backward(y, g, x, 1.0, 1.0)}
                for name, call in calls.items():
                    timed: set[str] = set()
                    for opts in forced:
                        if time.monotonic() - start > args.budget_s:
                            spent = True
                            break
                        chosen = plan_rows(rows, n, x.element_size(), LaunchOptions(**opts),
                                           device_sms(x), max_fused=limit,
                                           resident=resident_available(x))
                        if opts and chosen.describe() in timed:
                            continue
                        timed.add(chosen.describe())
                        with launch_options(**opts):
                            PLANS.clear()
                            ms = do_bench(call, return_mode="median")
                            took = list(PLANS.values())[-1]
                        share = copy_ms / ms * (2 if mode == "bwd" else 1)
                        rec = {"kernel": name, "mode": mode, "dtype": dname,
                               "shape": [rows, n], "plan": took.describe(),
                               "planned": chosen.describe(),
                               "table": not opts, "ms": ms, "copy_ms": copy_ms,
                               "pct_copy": round(100 * share, 1)}
                        results.append(rec)
                        print(f"{name:15} {mode} {dname} {rows}x{n:<7} {took.describe():40} "
                              f"{ms * 1e3:9.1f} us {100 * share:5.1f}% of copy"
                              f"{'  (table)' if not opts else ''}", flush=True)
            torch.cuda.empty_cache()
    (args.out / "rows-sweep.json").write_text(json.dumps({
        "device": torch.cuda.get_device_name(), "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
