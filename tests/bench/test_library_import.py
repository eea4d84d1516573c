"""What importing the library costs beyond `import torch` (issue 56's target: at most 0.3 s),
for pytest-benchmark, or on its own:

    pytest tests/bench/test_library_import.py --benchmark-only
    python tests/bench/test_library_import.py [rounds]

Each round is a fresh interpreter that times `import torch`, then `import
elasticbench.functional, elasticbench.nn`, with time.perf_counter around each; one round
first warms the bytecode caches and is not counted. Reports, never asserts on time (the
machine's load decides the figures); tests/project/test_library_alone.py asserts what is imported.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 15

CHILD = """
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import elasticbench.functional, elasticbench.nn
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def one_round() -> tuple[float, float]:
    """(seconds of `import torch`, seconds of the library's import after it) in a fresh
    interpreter."""
    child = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, check=True)
    torch_s, library_s = (float(v) for v in child.stdout.split())
    return torch_s, library_s


def summary(rounds: list[tuple[float, float]]) -> dict[str, float]:
    """Median and range of each import over the rounds, in seconds."""
    torch_s, library_s = ([r[i] for r in rounds] for i in (0, 1))
    return {"rounds": len(rounds), "torch_median_s": statistics.median(torch_s),
            "library_median_s": statistics.median(library_s),
            "library_min_s": min(library_s), "library_max_s": max(library_s)}


def test_library_import_beyond_torch(benchmark) -> None:
    """The library's import after torch's, one fresh interpreter a round."""
    one_round()  # warm-up: bytecode written, files in the page cache
    rounds: list[tuple[float, float]] = []
    benchmark.pedantic(lambda: rounds.append(one_round()), rounds=ROUNDS, iterations=1)
    benchmark.extra_info.update(summary(rounds))


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else ROUNDS
    one_round()
    found = summary([one_round() for _ in range(n)])
    print(f"{found['rounds']} fresh interpreters: import torch {found['torch_median_s']:.3f} s "
          f"(median); then elasticbench.functional, elasticbench.nn "
          f"{found['library_median_s']:.4f} s (median; {found['library_min_s']:.4f}-"
          f"{found['library_max_s']:.4f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
