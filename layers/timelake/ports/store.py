"""Job state: jobs, their units, and leases on table ranges.

One interface, an embedded (SQLite, `timelake.adapters.sqlite`) and a DynamoDB (`timelake.aws.store`)
implementation, held to the same contract tests. Writes that decide exactly-once behaviour are conditional: a unit is completed
once, a lease is taken once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from timelake.errors import JobNotFound, LeaseConflict


@dataclass
class JobRecord:
    job_id: str
    table: str
    phase: str
    spec: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass
class UnitRecord:
    unit_id: str
    info: dict[str, Any]
    status: str = "pending"
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class Lease:
    table: str
    start: int
    end: int
    job_id: str


def job_exists(job_id: str) -> ValueError:
    return ValueError(f"job {job_id} already exists")


def job_not_found(job_id: str) -> JobNotFound:
    return JobNotFound(f"no backfill job '{job_id}' (see `timelake backfill list`)")


def unit_not_found(job_id: str, unit_id: str) -> JobNotFound:
    return JobNotFound(f"job {job_id} has no unit '{unit_id}'")


def lease_conflict(lease: "Lease", holder: str) -> LeaseConflict:
    return LeaseConflict(
        f"table {lease.table}: the range overlaps unpublished backfill job {holder}; wait for it, resume it or abort it first"
    )


Guard = Callable[[JobRecord], None]


def accept(job: JobRecord) -> None:
    """The guard of an unconditional update."""


class JobStore(Protocol):
    def create_job(self, job: JobRecord) -> None: ...
    def get_job(self, job_id: str) -> JobRecord: ...
    def update_job(self, job_id: str, phase: str | None = None, **state: Any) -> JobRecord: ...
    def update_job_if(self, job_id: str, guard: Guard, phase: str | None = None, **state: Any) -> JobRecord:
        """``update_job``, atomically only if ``guard`` accepts the job as stored at the moment of the
        write: it raises to refuse, and nothing is written. Abort and publish decide who goes first
        through this (a transaction on SQLite, a conditional write on DynamoDB): no process can
        change the job between the guard's look and the write."""
        ...
    def list_jobs(self, table: str | None = None) -> list[JobRecord]: ...
    def put_units(self, job_id: str, units: list[UnitRecord]) -> None: ...
    def units(self, job_id: str) -> list[UnitRecord]: ...
    def unit(self, job_id: str, unit_id: str) -> UnitRecord: ...
    def job_and_unit(self, job_id: str, unit_id: str) -> tuple[JobRecord, UnitRecord]:
        """``get_job`` and ``unit`` in one request where the store can (what a writer reads per unit)."""
        ...
    def complete_unit(self, job_id: str, unit_id: str, result: dict[str, Any]) -> bool: ...
    def acquire_lease(self, lease: Lease) -> None: ...
    def release_lease(self, job_id: str) -> None: ...
    def leases(self, table: str | None = None) -> list[Lease]: ...
    def reserve_rows(self, job_id: str, rows: int, rows_per_second: float) -> float: ...


RATE_BURST_SECONDS = 1.0
# Phases a job never leaves: its units are history from then on (a store may let them expire).
TERMINAL = frozenset({"published", "dry_run_complete", "failed_validation", "aborted"})


def reserved_until(empty_at: float | None, now: float, rows: int, rows_per_second: float) -> float:
    """A job's rate budget as the time its reservations run out, after reserving ``rows`` more.

    The caller waits until ``RATE_BURST_SECONDS`` before that time: a worker that paused (to map
    and spill what it read, or to commit this very reservation) may catch up by up to a second's
    worth of rows, never more, and a new budget starts empty so a job never opens with a burst."""
    start = now + RATE_BURST_SECONDS if empty_at is None else max(empty_at, now)
    return start + rows / rows_per_second
