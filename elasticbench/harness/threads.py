"""OpenMP's wait policy for the commands that judge kernels rather than time them.

torch's OpenMP runtime (libgomp) keeps its idle worker threads spinning for a while after
every parallel region. `verify`, `hunt` and `selftest` call thousands of short kernels and
compute the next batch's reference on a second thread meanwhile: on a small machine the
spinning workers take the cores from that thread and from the kernel's own next call.
With the passive policy idle workers sleep instead. The number of threads and how work is
split among them stay as they are, so every kernel computes exactly what it computed
before (docs/numerics.md section 6.6). The benchmarking commands keep the runtime's default,
which is what users of the kernels get.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence
from pathlib import Path

PASSIVE_COMMANDS = frozenset({"verify", "hunt", "selftest"})


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in argv (the group's own options take no values), else None."""
    return next((a for a in argv if not a.startswith("-")), None)


def is_elasticbench(program: str) -> bool:
    """Whether argv[0] is the elasticbench command (its script or `python -m elasticbench`)."""
    path = Path(program)
    return path.name == "elasticbench" or (path.name == "__main__.py"
                                           and path.parent.name == "elasticbench")


def passive_openmp(argv: Sequence[str],
                   environ: MutableMapping[str, str] | None = None) -> bool:
    """Ask OpenMP for passive waiting (OMP_WAIT_POLICY) when argv (sys.argv) is the
    elasticbench command running a judging command and the user chose no policy; True when
    set. It takes effect only if torch's OpenMP runtime is loaded afterwards."""
    env = os.environ if environ is None else environ
    if (not argv or not is_elasticbench(argv[0]) or command_of(argv[1:]) not in PASSIVE_COMMANDS
            or "OMP_WAIT_POLICY" in env):
        return False
    env["OMP_WAIT_POLICY"] = "passive"
    return True
