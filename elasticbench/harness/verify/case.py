"""What every kind of kernel's verification case is: a function on one seeded input in one
dtype with one parameter set; its identity, spelled once, gives both the key its records
will have and the key that places it in a shard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elasticbench.harness.records import record_key
from elasticbench.harness.registry import KernelSpec


@dataclass(frozen=True)
class Case:
    """One input of one function: the unit the reference is computed for (a kind of kernel
    adds what its inputs need: rows a layout, attention nothing)."""

    function: str
    generator: str
    shape: tuple[int, ...]
    dtype: str
    params: tuple[tuple[str, float], ...]
    seed: int

    @property
    def param_dict(self) -> dict[str, float]:
        return dict(self.params)

    def identity(self) -> dict[str, Any]:
        """The record fields that say which case this is (records/identity.py), as written."""
        return {"dtype": self.dtype, "input": self.generator, "shape": list(self.shape),
                "params": self.param_dict, "seed": self.seed}


def case_key(spec: KernelSpec, case: Case) -> tuple:
    """The record_key that the record of spec on case will have."""
    return record_key({"kernel": spec.name, "mode": spec.mode, **case.identity()})


def shard_key(mode: str, case: Case) -> tuple:
    """What places (mode, case) in a shard: the case's identity, for every kernel of it."""
    return (mode, case.function, *case.identity().values())
