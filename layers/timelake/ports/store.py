"""Job state: jobs, their units, and leases on table ranges.

One interface, an embedded (SQLite, `timelake.adapters.sqlite`) and a DynamoDB (`timelake.aws.store`)
implementation, held to the same contract tests. Writes that decide exactly-once behaviour are conditional: a unit is completed
once, a lease is taken once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypedDict, Unpack

from timelake.errors import JobBusy, JobNotFound, LeaseConflict


class Phase(StrEnum):
    """Where a job is: each phase names the step done last (`timelake.model.report.NEXT_STEP` says
    what runs next). Stored as its value, so records written before the enum read back the same."""

    CREATED = "created"
    PLANNING = "planning"
    SCANNING = "scanning"
    SCANNED = "scanned"
    PLANNED = "planned"
    WRITING = "writing"
    WRITTEN = "written"
    STAGED = "staged"
    AWAITING_APPROVAL = "awaiting-approval"  # a canary's day waits for a person's decision
    VALIDATED = "validated"
    PUBLISHING = "publishing"
    REFRESHING = "refreshing"
    PUBLISHED = "published"
    DRY_RUN_COMPLETE = "dry_run_complete"
    FAILED_VALIDATION = "failed_validation"
    FAILED = "failed"
    ABORTED = "aborted"


class JobState(TypedDict, total=False):
    """What the steps record about a job, one key per fact, each written by the step named beside it
    and read by the later ones (and by a resume in another process). Stored as JSON, so values are
    JSON's types; nested records stay plain dicts where only the step that wrote them reads inside.
    Every key is optional: a job gains them as it goes."""

    # plan: scan
    planned_at_us: int  # the plan's instant, the "now" of retention and of live-row lineage
    scan_tasks: list[list[int]]  # [first, last) source pieces per scan task
    source_bytes: int
    schema_id: int
    spec_id: int
    direct_partitions: int  # partitions a scan task writes as their final file itself
    direct_span: list[int] | None  # [lo, hi) µs over all of those partitions: main's plan for the scan tasks
    source_uri: str
    source_fingerprint: str
    source_plan: dict[str, Any] | None  # what a scan in another process needs to list the same pieces
    columns_filled_with_null: list[str]
    ignored_source_columns: list[str]
    # plan: cut
    rows_in_source: int
    rows_in_scope: int
    rows_rejected: dict[str, int]  # per reason
    rejected_examples: dict[str, Any]
    rows_outside_range: int
    rows_outside_retention: int
    time_range: dict[str, str | None]
    range_start: int  # epoch microseconds, inclusive
    range_end: int  # epoch microseconds, exclusive
    source_gaps: list[Any]
    units_total: int
    estimated_cost: dict[str, Any]
    partition_sums: dict[str, Any]
    check_column: str | None
    value_issues: list[dict[str, Any]]  # `model.issues.Issues.to_json`
    states: dict[str, int]
    issue_days: dict[str, int]
    reject_budget: dict[str, Any]
    overlap_existing_rows: int  # dry run
    rows_duplicate_in_source: int  # dry run
    would_fail: str | None  # dry run
    diff: dict[str, Any]  # the diff's main tasks
    branch: str
    base_snapshot_id: int | None  # main at the plan (`model.lineage.PlanMark`)
    base_sequence_number: int | None
    # canary
    canary: dict[str, Any]
    canary_report: dict[str, Any]
    canary_snapshot_id: int | None
    awaiting_since: float
    canary_approved: bool
    approved_at: float
    approval_token: str | None
    # stage, validate
    staged_snapshot_id: int | None
    staged_on: int | None
    files: int
    validation_snapshots: dict[str, Any]
    checks: list[dict[str, Any]]
    diff_job: dict[str, Any]  # the job's diff, in brief
    diff_canary: dict[str, Any]  # the canary day's diff, in brief
    # publish, abort (`steps.abort`: committing and publish_committed guard abort against publish)
    published_chunks: dict[str, list[int]]  # chunk key -> the snapshot ids that hold it on main
    publish_conflicts: dict[str, float]  # staged rows live rows won over at publish: rows, sum
    rows_replaced: int
    committing: dict[str, Any] | None
    publish_committed: bool
    abort_requested: bool
    files_deleted: int
    chunks_on_main: list[str]
    # after publish
    rollups_refreshed: list[str]
    rule_events: int
    # the runner, the orchestrator, settings mid-job
    runs: list[list[float]]  # [start, last heartbeat] per run of the runner, epoch seconds
    runner: dict[str, Any]
    failed_phase: Phase
    error: str | None
    execution_arn: str
    executions: list[str]
    settings: dict[str, Any]
    settings_log: list[dict[str, Any]]
    paused_until: float | None  # quiet hours: when the window opens next (`model.window`)
    pauses: list[list[Any]]  # [start, end] of each pause in epoch seconds, end None while it lasts


@dataclass
class JobRecord:
    job_id: str
    table: str
    phase: Phase
    spec: dict[str, Any]
    state: JobState = field(default_factory=JobState)
    created_at: float = 0.0
    updated_at: float = 0.0
    #: ``[phase, epoch seconds]`` each time the job entered a phase, oldest first; the store appends it
    #: (`log_phase`), so the time of every step is known wherever the step ran (a Lambda, the runner)
    phase_log: list[list[Any]] = field(default_factory=list)


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


def job_busy(job_id: str) -> JobBusy:
    return JobBusy(f"job {job_id} is running in another process; follow it with: timelake backfill status {job_id} --watch")


def unit_not_found(job_id: str, unit_id: str) -> JobNotFound:
    return JobNotFound(f"job {job_id} has no unit '{unit_id}'")


def lease_conflict(lease: Lease, holder: str) -> LeaseConflict:
    return LeaseConflict(
        f"table {lease.table}: the range overlaps unpublished backfill job {holder}; wait for it, resume it or abort it first"
    )


Guard = Callable[[JobRecord], None]


def accept(job: JobRecord) -> None:
    """The guard of an unconditional update."""


MAX_PHASE_LOG = 500  # a job resumed over and over keeps its latest entries


STATE_KEYS = JobState.__required_keys__ | JobState.__optional_keys__


def apply_update(job: JobRecord, phase: Phase | None, state: JobState, now: float) -> None:
    """What every store does to a job it updates. A key not declared in `JobState` is refused: type
    checking sees keyword arguments, but not a ``**mapping`` built at run time, and a misspelt key
    would be written and never read."""
    unknown = sorted(set(state) - STATE_KEYS)
    if unknown:
        raise TypeError(f"job {job.job_id}: state key(s) {', '.join(unknown)} not declared in JobState")
    job.state.update(state)
    job.phase = phase or job.phase
    job.updated_at = now
    log_phase(job, phase, now)


def log_phase(job: JobRecord, phase: Phase | None, now: float) -> None:
    """Note that ``job`` enters ``phase`` at ``now``. Entering the phase it is in appends too: a step
    resumed after a crash starts a new stretch of its phase."""
    if phase is not None:
        job.phase_log = [*job.phase_log, [phase, round(now, 3)]][-MAX_PHASE_LOG:]


class JobStore(Protocol):
    def create_job(self, job: JobRecord) -> None: ...
    def get_job(self, job_id: str) -> JobRecord: ...
    def update_job(self, job_id: str, phase: Phase | None = None, **state: Unpack[JobState]) -> JobRecord: ...
    def update_job_if(self, job_id: str, guard: Guard, phase: Phase | None = None, **state: Unpack[JobState]) -> JobRecord:
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
    def reopen_units(self, job_id: str, unit_ids: list[str]) -> None:
        """Mark done units pending again, their results dropped: their files are gone (another engine's
        orphan removal took them before they were staged) and must be written again."""
        ...
    def acquire_lease(self, lease: Lease) -> None: ...
    def release_lease(self, job_id: str) -> None: ...
    def leases(self, table: str | None = None) -> list[Lease]: ...
    def reserve_rows(self, job_id: str, rows: int, rows_per_second: float, now: float | None = None) -> float:
        """Take ``rows`` from the job's source rate budget at ``rows_per_second``, or at the rate
        `set_rate` gave the job since; returns the seconds to wait before reading on (at ``now``,
        default the system's time)."""
        ...
    def set_rate(self, job_id: str, rows_per_second: int) -> None:
        """The rate every later reservation of the job goes by, whatever its reader started with (0: no limit)."""
        ...
    def note_progress(self, job_id: str, item: str, counts: dict[str, Any]) -> None:
        """Replace the progress counts of one piece of a running step (a scan task, the checks,
        the publish): one record per item, so parallel workers never contend for the job record."""
        ...
    def progress_notes(self, job_id: str) -> dict[str, dict[str, Any]]: ...
    def hold(self, job_id: str) -> AbstractContextManager[None]:
        """Mark the job as run by this process while the block runs; `JobBusy` if another process
        runs it. The mark goes when the process does, however it ends (SIGKILL included)."""
        ...
    def running(self, job_id: str) -> bool | None:
        """Whether a process holds the job now; None where the store cannot tell (on AWS the
        workflow's execution runs a job, and its status says whether it still does)."""
        ...


RATE_BURST_SECONDS = 1.0
# Phases a job never leaves: its units are history from then on (a store may let them expire).
TERMINAL = frozenset({Phase.PUBLISHED, Phase.DRY_RUN_COMPLETE, Phase.FAILED_VALIDATION, Phase.ABORTED})


def reserve(empty_at: float | None, now: float, rows: int, rows_per_second: float, set_rate: float | None) -> float | None:
    """The budget's new end after a reservation at the rate in force (``set_rate`` if the job's rate was
    set since its readers started, else theirs); None when that rate is no limit."""
    rate = rows_per_second if set_rate is None else set_rate
    return reserved_until(empty_at, now, rows, rate) if rate else None


def reserved_until(empty_at: float | None, now: float, rows: int, rows_per_second: float) -> float:
    """A job's rate budget as the time its reservations run out, after reserving ``rows`` more.

    The caller waits until ``RATE_BURST_SECONDS`` before that time: a worker that paused (to map
    and spill what it read, or to commit this very reservation) may catch up by up to a second's
    worth of rows, never more, and a new budget starts empty so a job never opens with a burst."""
    start = now + RATE_BURST_SECONDS if empty_at is None else max(empty_at, now)
    return start + rows / rows_per_second
