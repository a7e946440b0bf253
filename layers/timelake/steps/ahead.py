"""Write ahead: the units of a database source written while its scan goes on (embedded runner, one reader).

One reader scans a database source task after task in time order. Once a task is done, a partition
that ends by the next task's first row can get no more rows, so its units are written on a thread
while the scan reads on: the reader mostly waits for the server, and the write uses that CPU.
After the cut, a unit written ahead is recorded as written when the cut made the same unit (same
partition, slice and spill files) and, in merge mode, the unit read main at the snapshot the cut
branched from; every other unit is written by the write step as usual. A file written ahead whose
unit does not stand is deleted before the write step starts, so nothing written ahead is left unrecorded.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from timelake.model.spec import JobSpec
from timelake.ports.files import filesystem
from timelake.ports.runtime import Runtime
from timelake.ports.store import UnitRecord
from timelake.sources.postgres import is_postgres
from timelake.steps import canary
from timelake.steps.plan import units_before
from timelake.steps.write import unit_file


NICE = 10  # the writer ahead's nice value, above the scan's 0


class WriteAhead:
    """Units written during the scan, waiting for the cut to say whether they stand."""

    def __init__(self, rt: Runtime, job_id: str, spec: JobSpec, edges: list[int], tasks: list[list[int]]) -> None:
        self.rt, self.job_id, self.spec = rt, job_id, spec
        self.edges, self.tasks = edges, tasks
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="timelake-write-ahead", initializer=_give_way)
        self.written: dict[str, tuple[UnitRecord, Future]] = {}

    @classmethod
    def open(cls, rt: Runtime, job_id: str) -> WriteAhead | None:
        """For a database source read in UTC time ranges by one reader; None for anything else (a dry
        run or a canary writes no unit before its time, and other sources are not read in time order)."""
        job = rt.store.get_job(job_id)
        spec = JobSpec.model_validate(job.spec)
        plan = job.state.get("source_plan") or {}
        if spec.dry_run or canary.wanted(job) or not is_postgres(spec.source) or plan.get("kind") != "timestamptz":
            return None
        return cls(rt, job_id, spec, plan["edges"], job.state["scan_tasks"])

    def scanned(self, done: list[int], following: int | None) -> None:
        """After a task: write the units of the partitions that end by the next task's first row."""
        if following is None:
            return  # the scan is over: the write step writes the rest on all its workers
        for unit in units_before(self.rt, self.job_id, done, self.edges[self.tasks[following][0]]):
            if unit.unit_id not in self.written:
                self.written[unit.unit_id] = (unit, self.pool.submit(self._write, unit))

    def _write(self, unit: UnitRecord) -> tuple[int | None, dict[str, Any]]:
        snapshot = self.rt.load_table(self.spec.table).current_snapshot()
        return (snapshot.snapshot_id if snapshot else None), unit_file(self.rt, self.job_id, self.spec, unit, None)

    def adopt(self) -> int:
        """After the cut: record the units written ahead that stand; returns how many."""
        job = self.rt.store.get_job(self.job_id)
        made = {unit.unit_id: unit for unit in self.rt.store.units(self.job_id)}
        adopted = 0
        for unit_id, (unit, future) in self.written.items():
            try:
                snapshot, result = future.result()
            except Exception:  # noqa: BLE001 (the write step writes the unit again and reports its error)
                continue
            cut = made.get(unit_id)
            if cut is not None and cut.status != "done" and cut.info == unit.info and (
                    self.spec.mode != "merge" or snapshot == job.state.get("base_snapshot_id")):
                self.rt.store.complete_unit(self.job_id, unit_id, result)
                adopted += 1
            else:  # the write step writes the unit the cut made, if any, at the same path
                _delete(result["path"])
        self.written.clear()
        return adopted

    def close(self) -> None:
        """Stop writing ahead; files of units not adopted are deleted (the job failed or stopped before its cut)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        for _, future in self.written.values():
            if future.done() and not future.cancelled() and future.exception() is None:
                _delete(future.result()[1]["path"])
        self.written.clear()


def _give_way() -> None:
    """The writer ahead runs at a lower priority than the scan and the database: it is meant to use
    the CPU they leave idle, not to slow the scan down (Linux gives each thread its own nice value)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: the writer runs at the scan's priority
        pass


def _delete(path: str | None) -> None:
    if path:
        fs, local = filesystem(path)
        try:
            fs.delete_file(local)
        except FileNotFoundError:
            pass
