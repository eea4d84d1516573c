"""How much of a softmax timing is the allocator? torch.softmax on 64x262144 fp32, timed with
glibc's default heap settings and with the heap kept (mmap off, no trim), as `run` does.

    .venv/bin/python scripts/allocator_probe.py default
    .venv/bin/python scripts/allocator_probe.py pinned

Each setting needs its own process: mallopt cannot be undone for memory already mapped.
"""

from __future__ import annotations

import sys
import time

import torch


def median_seconds(fn, reps: int = 21) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[reps // 2]


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "default"
    if mode not in ("default", "pinned"):
        raise SystemExit("usage: allocator_probe.py default|pinned")
    torch.set_num_threads(2)
    if mode == "pinned":
        from elasticbench.harness.allocator import pin_heap

        print(f"allocator: {pin_heap()}")
    x = torch.randn(64, 262144)
    t = median_seconds(lambda: torch.softmax(x, -1))
    print(f"{mode}: torch.softmax {x.numel() / t / 1e9:.2f} G elements/s, "
          f"{2 * x.element_size() * x.numel() / t / 1e9:.1f} GB/s (minimum traffic)")


if __name__ == "__main__":
    main()
