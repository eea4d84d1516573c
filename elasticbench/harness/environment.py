"""What a result was measured on: the machine and the versions of everything involved."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from elasticbench.devices import cache_sizes, has_gpu


def cpu_model() -> str:
    """The host CPU's model name (/proc/cpuinfo, else what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The commit of the source tree elasticbench runs from, when it is a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


RECORDED = ("elasticbench", "numpy", "torch", "triton", "mpmath", "gmpy2", "ml_dtypes")


def recorded_versions() -> dict[str, str | None]:
    """The versions a results file records (None: not installed), Python's last."""
    versions = {name: _version(name) for name in RECORDED}
    versions["python"] = platform.python_version()
    return versions


def version_text() -> str:
    """`elasticbench --version`: its version, then each version a results file records
    and the git commit, one a line."""
    versions = recorded_versions()
    lines = [f"elasticbench {versions.pop('elasticbench') or 'unknown'}"]
    lines += [f"  {name} {v or 'not installed'}" for name, v in versions.items()]
    return "\n".join([*lines, f"  commit {git_commit() or 'unknown (not a git checkout)'}"])


def describe(include_gpu: bool = True) -> dict[str, Any]:
    """Machine and software description for the header of a results file."""
    machine: dict[str, Any] = {
        "cpu": cpu_model(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "caches": cache_sizes(),
        "os": platform.platform(),
        "gpu": None,
    }
    versions = recorded_versions()
    if include_gpu and versions["torch"] and has_gpu():
        import torch

        props = torch.cuda.get_device_properties(0)
        machine["gpu"] = {"name": props.name, "memory": props.total_memory,
                          "sms": props.multi_processor_count, "cuda": torch.version.cuda}
    return {"machine": machine, "versions": versions, "commit": git_commit()}
