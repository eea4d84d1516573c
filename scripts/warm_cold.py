"""Warm against cold cache: the same kernels and shapes timed both ways with `run`'s engine.

    .venv/bin/python scripts/warm_cold.py [--json PATH] [KERNEL ...]

Each (kernel, dtype, shape) is timed twice on one input with its backend's clock: warm
(calls repeated on what the cache holds, as `run` times an in-cache size) and cold (the
device's cache evicted before each sample, outside the timed span, as `run` times an
out-of-cache size on a GPU). On a CPU the clock cannot flush, so both rows read warm.
Needs a GPU for the triton kernels (or TRITON_INTERPRET=1); ELASTICBENCH_TORCH_DEVICE=cuda
puts the torch kernels there.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

from elasticbench.harness.backends import get_backend
from elasticbench.harness.bench.cases import RunCase
from elasticbench.harness.bench.models import minimum_bytes
from elasticbench.harness.bench.runner import params_for
from elasticbench.harness.bench.timing import Policy, time_calls
from elasticbench.harness.inputs import generate
from elasticbench.harness.registry import get_kernel

SHAPES = ((512, 4096), (2048, 4096), (4096, 4096))
DTYPES = ("fp32", "bf16")


def _call(fn, x, params, i: int) -> None:
    fn(x, **params)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernels", nargs="*", default=["triton_softmax", "torch_softmax"])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    policy, case = Policy(budget_s=0.5), RunCase("warm-cold")
    rows = []
    print(f"{'kernel':16} {'dtype':5} {'shape':>10} {'warm us':>9} {'cold us':>9} "
          f"{'warm GB/s':>10} {'cold GB/s':>10}")
    for name in args.kernels:
        spec = get_kernel(name)
        backend = get_backend(spec.backend)
        params = params_for(case, spec.function)
        for dtype in DTYPES:
            for shape in SHAPES:
                x = backend.to_native(generate("normal", dtype, shape, 0))
                row = {"kernel": name, "dtype": dtype, "shape": list(shape),
                       "device": backend.device(), "llc_bytes": backend.llc_bytes(),
                       "min_bytes": minimum_bytes(*shape, x.element_size(), "fwd")}
                call = partial(_call, spec.fn, x, params)
                for cold in (False, True):
                    t = time_calls(call, policy, backend.clock(), cold=cold)
                    row["cold" if cold else "warm"] = {
                        "median_s": t.stats.median_ns * 1e-9, "spread": t.stats.spread,
                        "reps": len(t.samples_ns), "inner": t.inner, "clock": t.clock}
                w, c = row["warm"]["median_s"], row["cold"]["median_s"]
                gb = row["min_bytes"] / 1e9
                print(f"{name:16} {dtype:5} {shape[0]:>5}x{shape[1]:<4} {w * 1e6:9.1f} "
                      f"{c * 1e6:9.1f} {gb / w:10.0f} {gb / c:10.0f}")
                rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
