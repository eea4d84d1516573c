"""Compile every launch the Triton row kernels make for the GPU shapes, for sm_90, and report
the launch plan each shape takes and what the compiler made of each kernel. Where the table
takes the resident path (one read of a long row), the two-read plan it replaces (resident=-1)
is compiled and reported too.

    python scripts/triton_rows_audit.py [--json results/triton-audit/rows-h100-sxm.json]

The wrappers are called on CPU tensors with their launches recorded, never run
(elasticbench/harness/audit/capture.py), so the plans are those of an H100's 132 SMs
(kernels/triton/launch.py, plan_rows); each distinct launch is compiled once for sm_90 and read
back: registers, spills (local memory, STL instructions), shared memory, resident programs per
SM, and the global load and store widths. Exits 1 when a launch spills or does not compile.
Needs no GPU; run it without TRITON_INTERPRET (the compiler, not the interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# shapes: cases/gpu.toml and cases/gpu-bwd.toml, short rows, a backward row past the
# backward's register-resident limit, and long rows that are neither few nor many
SHAPES = [(512, 4096), (4096, 4096), (256, 262144), (65536, 128), (16384, 512), (512, 16384),
          (1024, 65536)]
DTYPES = ("fp32", "bf16")


def audit(shapes: list[tuple[int, int]], dtypes: tuple[str, ...]) -> list[dict]:
    """One row per (kernel, mode, dtype, shape, launch): the plan and the compiled code."""
    import torch

    from elasticbench.harness.audit.capture import capture_launches
    from elasticbench.harness.audit.compile import compile_launch, opcode_width, read_cubin
    from elasticbench.harness.builtin import triton_kernels  # noqa: F401  (registers the kernels)
    from elasticbench.harness.registry import list_kernels
    from elasticbench.kernels.triton import launch as launch_mod

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    params = {"elastic": {"tau": 1.0, "beta": 1.0}, "symax": {"eta": 1.0}}
    specs = [s for mode in ("fwd", "bwd") for s in list_kernels(backend="triton", mode=mode)
             if s.kind == "row"]
    compiled: dict[tuple, dict] = {}
    rows_out: list[dict] = []
    for dtype in dtypes:
        for rows, n in shapes:
            x = torch.empty(rows, n, dtype=torch_dtype[dtype])
            for spec, plan, launches in _captures(specs, x, params, capture_launches, launch_mod):
                for launch in launches:
                    # runtime values (the grid's size, a split's span) compile alike
                    key = (launch.name, dtype, repr(sorted(
                        (k, repr(v)) for k, v in launch.kwargs.items()
                        if k not in launch_mod.RUNTIME_VALUES)))
                    if key not in compiled:
                        compiled[key] = _compile(launch, compile_launch, read_cubin,
                                                 opcode_width, launch_mod)
                    rows_out.append({"kernel": spec.name, "mode": spec.mode, "dtype": dtype,
                                     "shape": [rows, n], "plan": plan, "launch": launch.name,
                                     **compiled[key]})
    return rows_out


def _captures(specs, x, params, capture_launches, launch_mod):
    """(spec, plan, launches) of each kernel's call on x: the table's, and where that is the
    resident path, the plan with it forbidden."""
    for spec in specs:
        for options in ({}, {"resident": -1}):
            launch_mod.PLANS.clear()
            with launch_mod.launch_options(**options), capture_launches() as launches:
                if spec.mode == "bwd":
                    spec.fn(x, x, x, **params.get(spec.function, {}))
                else:
                    spec.fn(x, **params.get(spec.function, {}))
            (plan,) = (p.describe() for p in launch_mod.PLANS.values())
            yield spec, plan, launches
            if not plan.startswith("resident"):
                break


def _compile(launch, compile_launch, read_cubin, opcode_width, launch_mod) -> dict:
    try:
        out = compile_launch(launch, 90)
    except Exception as e:  # reported, and fails the audit
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    regs, local_bytes, ops = read_cubin(out.asm["cubin"])
    warps = launch.num_warps
    shared = int(out.metadata.shared)
    return {"warps": warps, "regs": regs, "local_bytes": local_bytes,
            "stl": sum(op.startswith("STL") for op in ops), "shared": shared,
            "programs_per_sm": launch_mod.resident_programs(regs, shared, warps,
                                                            launch_mod.SMLimits()),
            "ldg_bits": sorted({opcode_width(op) for op in ops if op.startswith("LDG")}),
            "stg_bits": sorted({opcode_width(op) for op in ops if op.startswith("STG")})}


def table(rows: list[dict]) -> str:
    """The audit as fixed-width text, one line per launch."""
    head = ("kernel", "mode", "dtype", "shape", "plan", "launch", "warps", "regs", "STL",
            "prog/SM", "LDG", "STG")
    lines = [head]
    for r in rows:
        shape = "x".join(map(str, r["shape"]))
        if "error" in r:
            lines.append((r["kernel"], r["mode"], r["dtype"], shape, r["plan"], r["launch"],
                          "error", r["error"], "", "", "", ""))
            continue
        lines.append((r["kernel"], r["mode"], r["dtype"], shape, r["plan"], r["launch"],
                      str(r["warps"]), str(r["regs"]), str(r["stl"]), str(r["programs_per_sm"]),
                      ",".join(map(str, r["ldg_bits"])), ",".join(map(str, r["stg_bits"]))))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("-d", "--dtypes", default=",".join(DTYPES))
    parser.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES),
                        help="ROWSxN,... (default: every shape above)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("error: run without TRITON_INTERPRET (this compiles)", file=sys.stderr)
        return 2
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    if not dtypes or any(d not in ("fp32", "fp16", "bf16") for d in dtypes):
        print(f"error: dtypes must be among fp32, fp16, bf16, got {args.dtypes!r}",
              file=sys.stderr)
        return 2
    try:
        shapes = [(int(r), int(n)) for r, n in (s.split("x") for s in args.shapes.split(","))]
    except ValueError:
        print(f"error: shapes must be ROWSxN,..., got {args.shapes!r}", file=sys.stderr)
        return 2
    rows = audit(shapes, dtypes)
    print(table(rows))
    if args.json:
        import triton

        args.json.write_text(json.dumps({"arch": 90, "triton": triton.__version__, "rows": rows},
                                        indent=1) + "\n")
    bad = [r for r in rows if "error" in r or r["stl"] or r["local_bytes"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
