"""The Triton row kernels under every launch plan worth trying, against the in-run copy: the
figures that set kernels/triton/launch.py's table (plan_rows) on a GPU.

    python scripts/gpu_rows_sweep.py OUT_DIR [--budget-s 240] [--dry-run]

For each shape (cases/gpu.toml's, short rows, a backward row past its register limit), dtype
(fp32, bf16), direction (forward: triton_elastic and triton_softmax; backward:
triton_elastic) and plan (the table's, and each forced alternative that differs from it:
rows per program on short rows; on long rows the two-read split at each split count, one
program a row (online), and the single-read resident path at each programs-per-row count), it
times the kernel with triton.testing.do_bench (medians, L2 flushed) and
a device-to-device copy of the same input, and prints and writes (OUT_DIR/rows-sweep.json)
the share of the copy's bandwidth each reaches: forward (read x, write y) against the copy
of x (read, write); backward (read x, y, g, write dx) against twice it. It stops starting
new timings when the budget is spent. The plan recorded is the one the call took, as the
library noted it (elasticbench.launches; a resident launch the driver refuses falls back to
the split path, and says so here). OUT_DIR/rows-sweep.json is rewritten after every timing,
and each timing is a figure of scripts/gpu_checks.sh's figures.jsonl as it is measured, so a
run cut short keeps what it measured. Without CUDA it prints one line and exits 0; with
--dry-run (what gpu_checks.sh --dry-run runs) it times one tiny shape on the CPU under
Triton's interpreter (TRITON_INTERPRET=1), two alternatives a plan: plumbing, not figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_figures import Figures, one_line, timer

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


def _write(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--dry-run", action="store_true",
                        help="one tiny shape on the CPU under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    import torch

    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        parser.exit(2, "gpu_rows_sweep: --dry-run needs TRITON_INTERPRET=1\n")
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_rows_sweep: no CUDA device, nothing timed")
        return 0
    from elasticbench import launches
    from elasticbench.kernels.triton.elastic_backward import elastic_backward
    from elasticbench.kernels.triton.exp_family import elastic_forward, softmax_forward
    from elasticbench.kernels.triton.launch import (
        LaunchOptions,
        device_sms,
        launch_options,
        plan_rows,
        resident_available,
    )

    device = "cpu" if args.dry_run else "cuda"
    shapes = [(4, 64)] if args.dry_run else SHAPES
    time_ms = timer(not args.dry_run)
    figures = Figures()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rows-sweep.json"
    start = time.monotonic()
    doc: dict[str, Any] = {"device": (torch.cuda.get_device_name() if device == "cuda"
                                      else "cpu (dry run, interpreter)"), "results": [],
                           "left_out": []}
    _write(path, doc)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    spent = False
    for rows, n in shapes:
        if spent or time.monotonic() - start > args.budget_s:
            print(f"budget spent: stopped before {rows}x{n}")
            doc["left_out"].append([rows, n])
            spent = True
            continue
        for dname, dtype in dtypes.items():
            x = torch.randn(rows, n, device=device).to(dtype)
            copy_ms = time_ms(lambda x=x: x.clone())
            for mode in ("fwd", "bwd"):
                limit = LaunchOptions().max_fused // (2 if mode == "bwd" else 1)
                table = plan_rows(rows, n, x.element_size(), LaunchOptions(), device_sms(x),
                                  max_fused=limit, resident=resident_available(x))
                forced = [{}, *alternatives(table.path)]
                if args.dry_run:
                    forced = forced[:2]
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
                        rec = {"kernel": name, "mode": mode, "dtype": dname,
                               "shape": [rows, n], "planned": chosen.describe(),
                               "table": not opts, "options": opts, "copy_ms": copy_ms}
                        try:
                            with launch_options(**opts):
                                with launches.noting() as notes:
                                    call()
                                rec["plan"] = launches.summary(notes)
                                ms = time_ms(call)
                        except Exception as e:  # a plan the device refuses: say so, go on
                            rec.update(ms=None, error=one_line(e))
                            print(f"{name:15} {mode} {dname} {rows}x{n:<7} "
                                  f"{chosen.describe():40} failed: {rec['error']}", flush=True)
                        else:
                            share = copy_ms / ms * (2 if mode == "bwd" else 1)
                            rec.update(ms=ms, pct_copy=round(100 * share, 1))
                            print(f"{name:15} {mode} {dname} {rows}x{n:<7} {rec['plan']!s:40} "
                                  f"{ms * 1e3:9.1f} us {100 * share:5.1f}% of copy"
                                  f"{'  (table)' if not opts else ''}", flush=True)
                        doc["results"].append(rec)
                        _write(path, doc)
                        figures.add(f"rows_sweep {name} {mode} {rec['planned']}"
                                    + (" (table)" if not opts else ""), rec.get("pct_copy"),
                                    "% of copy", shape=[rows, n], dtype=dname, ms=rec["ms"],
                                    plan=rec.get("plan"), error=rec.get("error"))
            if device == "cuda":
                torch.cuda.empty_cache()
    _write(path, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
