"""A kind of kernel: what its kernels take (rows; q, k, v) decides its matrix, its cases, its
size syntax and its jobs. The commands ask the kind; adding a kind is one more entry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from elasticbench.harness.execute import Isolation
from elasticbench.harness.registry import KernelSpec
from elasticbench.harness.selftest.outcomes import SelftestOutcome
from elasticbench.harness.session import Job

Chooser = Callable[[list[str], list[str], list[str], list[str], str], list[KernelSpec]]


@dataclass(frozen=True)
class VerifyOptions:
    """What `verify` was asked, beyond the kernels: restrictions of the matrix and the
    reference's settings (names already split, not yet checked against the kind)."""

    dtypes: list[str]
    inputs: list[str]
    sizes: list[str]
    layouts: list[str]
    params: dict[str, float]
    precision: int
    jobs: int | None
    no_cache: bool
    isolation: Isolation
    scale: float = 1.0  # --budget-scale: every allowance of the run times it
    lanes: bool = True  # a second kernel lane where it pays (--one-lane: none)


@dataclass(frozen=True)
class RunOptions:
    """What `run` was asked, beyond the case file (names already split)."""

    functions: list[str]
    backends: list[str]
    dtypes: list[str]
    sizes: list[str]
    mode: str | None
    only: list[str]
    kernel_files: list[str]
    processes: int | None
    isolation: Isolation
    choose: Chooser  # the command's way to pick kernels (one line and exit 2 when bad)


class Kind(ABC):
    """One kind of kernel. Methods raise ValueError (a CaseFileError for a case file) with
    the one line a command prints for bad input."""

    name: ClassVar[str]  # functions.function_kind's answer for its functions
    matrix: ClassVar[str]  # the built-in verification matrix (cases/<matrix>.toml)
    quick_matrix: ClassVar[str]  # the small one (--quick)
    run_table: ClassVar[str]  # the table of a case file that `run` times

    @abstractmethod
    def function(self, name: str) -> Any:
        """The function object of one of this kind's functions (its parameters, checks)."""

    @abstractmethod
    def verify_job(self, path: Path, kernels: dict[str, list[KernelSpec]],
                   options: VerifyOptions) -> Job:
        """The job that verifies kernels (per mode) on the matrix at path as restricted."""

    @abstractmethod
    def run_job(self, path: Path, options: RunOptions) -> tuple[Job, dict[str, Any]]:
        """The job that times the run case at path, and its results file's header."""

    @abstractmethod
    def selftest(self, correct: list[KernelSpec], cache: Path | None) -> list[SelftestOutcome]:
        """This kind's mutants, each of which must fail, and the correct kernels, which must
        pass, verified on its quick matrix (the mpmath references cached under cache)."""


def no_cases(path: Path) -> ValueError:
    """The error of a matrix left with nothing to verify."""
    return ValueError(f"the matrix {path} has no case for the chosen kernels, dtypes and inputs")
