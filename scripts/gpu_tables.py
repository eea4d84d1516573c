"""The tables of results/gpu/README.md from a GPU run's results file:

    python scripts/gpu_tables.py results/gpu/run.json [--kernels triton_softmax,triton_elastic]

One markdown row per (kernel, dtype, shape): median, GB/s, % of the run's copy bandwidth, and
the median of each reference point (torch.softmax, the function's torch.compile kernel, or the
backward's baselines) over the kernel's, all from the same records file.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable

REFERENCES = {"fwd": {"torch.softmax": "torch_softmax",
                      "torch.compile": {"softmax": "compiled_softmax",
                                        "elastic": "compiled_elastic"}},
              "bwd": {"torch softmax bwd": "torch_softmax",
                      "torch_elastic_bwd": "torch_elastic_bwd"}}


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def rows(records: list[dict], kernels: Iterable[str]) -> list[str]:
    """Markdown rows for the given kernels (in that order, each one's rows in the file's),
    with their reference points' ratios ('-' where the run has no such reference)."""
    median = {(r["kernel"], r["dtype"], tuple(r["shape"])): r["median_s"] for r in records
              if r.get("median_s")}
    order = list(kernels)
    out = []
    for r in sorted((r for r in records if r["kernel"] in order and r.get("median_s")),
                    key=lambda r: order.index(r["kernel"])):
        key = (r["dtype"], tuple(r["shape"]))
        ratios = []
        for ref in REFERENCES[r["mode"]].values():
            name = ref.get(r["function"]) if isinstance(ref, dict) else ref
            base = median.get((name, *key))
            ratios.append(f"{base / r['median_s']:.2f}" if base else "-")
        shape = "x".join(map(str, r["shape"]))
        out.append(f"| {r['kernel']} | {r['dtype']} | {shape} | {r['cache']} | "
                   f"{_time(r['median_s'])} | {r['gbps']:.0f} | {r['pct_copy']:.0f}% | "
                   + " | ".join(ratios) + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--kernels", default="triton_softmax,triton_elastic")
    args = ap.parse_args()
    with open(args.results) as f:
        data = json.load(f)
    mode = data["records"][0]["mode"]
    heads = ["kernel", "dtype", "shape", "cache", "median", "GB/s", "% copy",
             *(f"x {name}" for name in REFERENCES[mode])]
    print(f"copy {data['ceilings']['copy_gbps']:.0f} GB/s")
    print("| " + " | ".join(heads) + " |")
    print("|" + "|".join(":--" if i < 4 else "--:" for i in range(len(heads))) + "|")
    print("\n".join(rows(data["records"], args.kernels.split(","))))


if __name__ == "__main__":
    main()
