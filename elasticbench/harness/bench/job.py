"""The run command's job: ceilings, quick verification, then every planned unit timed."""

from __future__ import annotations

from typing import Any

from elasticbench.harness.bench.cases import RunCase
from elasticbench.harness.bench.runner import Unit, measure_ceilings, run_units, verify_quickly
from elasticbench.harness.execute import Isolation
from elasticbench.harness.numerics.truth.cache import TruthStore, default_cache_dir
from elasticbench.harness.session import Job, Session


class RunJob(Job[Unit]):
    """Time planned units (see plan_units) on a device against its measured ceilings."""

    kind = "run"

    def __init__(self, case: RunCase, units: list[Unit], dtypes: list[str], device: str,
                 isolation: Isolation):
        self.case, self.units, self.dtypes = case, units, dtypes
        self.device, self.isolation = device, isolation

    def plan(self) -> list[Unit]:
        return self.units

    def shard_key(self, unit: Unit) -> Any:
        return unit.cell  # a shard holds whole cells: each record's baseline is timed with it

    def work(self, units: list[Unit], session: Session) -> None:
        done = {r.unit for r in session.records}
        units = [u for u in units if u.key not in done]
        case = self.case
        timed = list({id(u.spec): u.spec for u in units}.values())
        task = session.task(f"{case.name} · ceilings", len(units) * case.timing.processes + 2)
        ceilings = measure_ceilings(self.device, self.dtypes, case.timing)
        session.header["ceilings"] = ceilings.to_dict()
        task.advance()
        task.describe(f"{case.name} · quick verification")
        verdicts = verify_quickly(timed, case, self.dtypes, TruthStore(default_cache_dir()),
                                  isolation=self.isolation)
        session.header["verification"] = {f"{k}/{d}": v.to_dict()
                                           for (k, d), v in verdicts.items()}
        task.advance()
        run_units(case, units, ceilings, verdicts, earlier=list(session.records),
                  isolation=self.isolation,
                  on_start=lambda u: task.describe(
                      f"{case.name} · {u.spec.name} · {u.shape[0]}x{u.shape[1]} {u.dtype}"),
                  on_measured=task.advance, on_record=session.add)
