"""Entry points for an external orchestrator: the Step Functions workflow and the HTTP API.

The embedded runner drives the steps itself; on AWS the state machine does, one Lambda per step.
These functions are what the thin handlers call: JSON-able input, JSON-able output, idempotent.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, model_validator

from timelake import memory
from timelake.adapters import runtime_for
from timelake.errors import JobNotFound, ValidationFailed
from timelake.followup.refresh import PublishedEvent, on_published, pieces
from timelake.model.limits import limits
from timelake.model.report import report_of
from timelake.model.spec import JobSpec, current_setting, current_spec
from timelake.model.window import window_of
from timelake.ports.clock import wait_timestamp
from timelake.ports.runtime import LakeConfig, Runtime
from timelake.ports.store import JobRecord, Phase
from timelake.runner import TERMINAL, record_failure, reopen
from timelake.steps import canary
from timelake.steps.diff import finish_dry_run, pending_main_tasks
from timelake.steps.plan import cut, pending_pieces, plan, write_json
from timelake.steps.schedule import closed_until
from timelake.steps.validate import plan_checks

if TYPE_CHECKING:
    from timelake.aws.queue import WorkQueue

DEFAULT_MAP_CONCURRENCY = 100
SUMMARY_KEYS = ("job_id", "table", "mode", "phase", "rows_in_source", "rows_written", "rows_duplicate_in_source",
                "rows_conflicting_existing", "rows_outside_retention", "rows_outside_range", "units", "files",
                "overlap_existing_rows", "time_range", "published_snapshot_ids", "error")


class ExecutionEvent(BaseModel):
    """The execution input (a job JSON) and the execution name, which is the job id unless the job
    JSON names one (a resume runs as a new execution of an existing job)."""

    job: dict[str, Any]
    execution_name: str

    @property
    def job_id(self) -> str:
        return str(self.job.get("job_id") or self.execution_name)

    def spec(self) -> JobSpec:
        return JobSpec.model_validate({**self.job, "job_id": self.job_id})


class JobEvent(BaseModel):
    job_id: str


class UnitEvent(JobEvent):
    unit_id: str


class PieceEvent(JobEvent):
    piece: int


class MainTaskEvent(JobEvent):
    """One item of a job's main tasks (`timelake.steps.diff`), which the write Lambda runs before the units."""

    main_task: int


class PublishEvent(JobEvent):
    max_chunks: int | None = None


class ValidateEvent(JobEvent):
    """The validate Lambda's two steps around the per-file checks: ``list`` them as the items of the
    workflow's Distributed Map, then ``conclude`` from the facts each item stored."""

    action: Literal["list", "conclude"] = "conclude"


class CheckEvent(JobEvent):
    """One item of the checks manifest (`timelake.steps.validate.plan_checks`): one staged file."""

    file: str
    spec_id: int
    partition: int


class CanaryEvent(JobEvent):
    """The workflow's canary steps: check the written day, wait (storing the task token), approve, reject."""

    action: Literal["check", "await", "approve", "reject"]
    token: str | None = None
    reason: str | None = None

    @model_validator(mode="after")
    def _token_to_keep(self) -> CanaryEvent:
        if self.action == "await" and not self.token:
            raise ValueError("action 'await' needs the task token ($$.Task.Token)")
        return self


class AbortEvent(JobEvent):
    """Abort a job; ``canary`` marks the workflow's rejected (or timed out) canary, whose ``reason``
    is the decision's error."""

    canary: bool = False
    reason: str | None = None


class FailureEvent(ExecutionEvent):
    error: str = "Error"
    cause: str | None = None


def lambda_runtime() -> Runtime:
    """The runtime of this Lambda container, from ``TIMELAKE_CONFIG``; reused across invocations. Its
    allocator is set for the engine's arrays (`timelake.memory`) before the first one is made."""
    memory.tune()
    return runtime_for(LakeConfig.from_env())


def ensure_job(rt: Runtime, spec: JobSpec) -> JobRecord:
    """The job record for ``spec``, created if new (a job id is the execution name: starting twice is safe).
    A job that names a catalog other than the stack's is refused before anything is recorded."""
    rt.check_catalog(spec.catalog)
    try:
        return rt.store.get_job(spec.job_id)
    except JobNotFound:
        with contextlib.suppress(ValueError):  # created concurrently: same id, same job
            rt.store.create_job(JobRecord(spec.job_id, spec.table, Phase.CREATED, spec.to_json()))
        return rt.store.get_job(spec.job_id)


def begin(rt: Runtime, spec: JobSpec) -> dict[str, Any]:
    """Plan step of the workflow: plan a new job, or pick up an existing one where it stopped.

    Returns where the list of source pieces still to scan is (empty once scanning is over), so the
    Distributed Map reads its items from S3 and job size never meets the state payload limit.
    """
    ensure_job(rt, spec)
    job = reopen(rt, spec.job_id)
    if job.phase in (Phase.CREATED, Phase.PLANNING):
        rt.store.update_job(spec.job_id, Phase.PLANNING)
        plan(rt, spec.job_id, parallelism=DEFAULT_MAP_CONCURRENCY)
        job = rt.store.get_job(spec.job_id)
    pieces = pending_pieces(rt, spec.job_id) if job.phase == Phase.SCANNING else []
    manifest = write_json(rt, spec.job_id, f"scan/pending-{time.time_ns()}.json",
                          [{"job_id": spec.job_id, "piece": i} for i in pieces])
    return {"job_id": spec.job_id, "pieces_pending": len(pieces), "manifest": manifest,
            "max_concurrency": map_concurrency(rt.store.get_job(spec.job_id), "scan")}


def map_concurrency(job: JobRecord, step: str) -> int:
    """The MaxConcurrency of the job's scan, write or check Map, from its settings as they are now (a
    scan reads the source through at most its connections)."""
    wanted = current_setting(job, "max_concurrency") or DEFAULT_MAP_CONCURRENCY
    return limits(current_spec(job.spec, job.state)).scan_workers(wanted) if step == "scan" else wanted


def wait_for_window(rt: Runtime, job_id: str) -> str | None:
    """For a Lambda about to start a unit (a scan task, a unit write, a file check, a publish commit):
    None to go on, else when its quiet hours open again, as the timestamp the workflow's Wait state
    waits until (the job notes the pause, so status shows it)."""
    if not _has_window(rt, job_id):
        return None
    until = closed_until(rt, rt.store.get_job(job_id))
    return None if until is None else wait_timestamp(rt.clock.workflow_instant(until))


@functools.lru_cache(maxsize=1024)
def _has_window(rt: Runtime, job_id: str) -> bool:
    """Whether the job has quiet hours, which it keeps from its submission on: a warm Lambda asks the
    job store once per job, so the units of a job without them cost no read for it."""
    return window_of(rt.store.get_job(job_id).spec) is not None


def cut_units(rt: Runtime, job_id: str) -> dict[str, Any]:
    """Cut step of the workflow: merge the scans into work units (once), then list what the write Map
    runs next: the main tasks of the job's diff not done yet (``more``: the workflow comes back here
    after them), else the units still to write (a dry run's too, which comes back to be finished). A
    dry run that is over, or a job that already ended, has nothing to write and returns its report."""
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    if job.phase in (Phase.SCANNING, Phase.SCANNED):
        cut(rt, job_id)
        job = rt.store.get_job(job_id)
    only = canary.select(rt, job_id) if job.phase not in TERMINAL and canary.wanted(job) else None  # a canary's day first
    chosen = rt.store.get_job(job_id).state.get("canary") if only is not None else None
    span = (chosen["start"], chosen["end"]) if chosen else None
    tasks = pending_main_tasks(rt, job_id, span) if job.phase not in TERMINAL else []
    pending = [u.unit_id for u in rt.store.units(job_id) if u.status != "done" and (only is None or u.unit_id in only)] \
        if job.phase not in TERMINAL and not tasks else []
    if spec.dry_run and job.phase not in TERMINAL and not tasks and not pending:
        finish_dry_run(rt, job_id)
        job = rt.store.get_job(job_id)
    if job.phase in TERMINAL:
        if job.phase == Phase.FAILED_VALIDATION:
            raise ValidationFailed(f"job {job_id} failed validation; nothing was published. Start a new job")
        return {"job_id": job_id, "dry_run": job.phase == Phase.DRY_RUN_COMPLETE, "finished": True,
                "report": summary(rt, job_id), "manifest": None, "units_pending": 0, "max_concurrency": 1,
                "canary": False, "more": False, "approval_timeout_seconds": spec.approval_timeout_seconds}
    if job.phase == Phase.PLANNED:
        rt.store.update_job(job_id, Phase.WRITING)
    items = [{"job_id": job_id, "main_task": t} for t in tasks] or [{"job_id": job_id, "unit_id": u} for u in pending]
    manifest = write_json(rt, job_id, f"pending-units-{time.time_ns()}.json", items)
    return {"job_id": job_id, "dry_run": False, "finished": False, "report": None, "units_pending": len(items),
            "manifest": manifest, "max_concurrency": map_concurrency(job, "write"),
            "canary": only is not None and not tasks, "more": bool(tasks) or spec.dry_run,
            "approval_timeout_seconds": spec.approval_timeout_seconds}


def list_checks(rt: Runtime, job_id: str) -> dict[str, Any]:
    """First part of the workflow's validation: the staged files as check items in S3, where the
    Distributed Map reads them, so the state holds their location and count, never the list."""
    listed = plan_checks(rt, job_id)
    return {**listed, "max_concurrency": max(1, min(map_concurrency(rt.store.get_job(job_id), "check"), listed["files"]))}


def after_publish(rt: Runtime, detail: dict[str, Any], queue: WorkQueue | None) -> dict[str, Any]:
    """The rollup Lambda on a "Backfill Published" event: the follow-up work of a chunk that is one
    piece (a day, or a month with daily rollups) is done here; a longer chunk is cut into its pieces,
    one work item each on ``queue``, whose consumers (`on_published`) run as many at once as the queue
    lets them. Without a queue every piece is done here, one after the other."""
    event = PublishedEvent.model_validate(detail)
    work = pieces(rt, event)
    if len(work) == 1 or queue is None:
        done = [on_published(rt, piece) for piece in work]
        return {"job_id": event.job_id, **{key: _merged([d[key] for d in done]) for key in done[0]}}
    queue.send([piece.model_dump() for piece in work])
    return {"job_id": event.job_id, "pieces_queued": len(work)}


def _merged(parts: list[Any]) -> Any:
    """Per-piece results added up: counts, or counts per rollup table."""
    if isinstance(parts[0], dict):
        return {k: sum(p.get(k, 0) for p in parts) for k in parts[0]}
    return sum(parts)


def finish_writes(rt: Runtime, job_id: str) -> None:
    job = rt.store.get_job(job_id)
    if job.phase in (Phase.PLANNED, Phase.WRITING):
        rt.store.update_job(job_id, Phase.WRITTEN)


def fail(rt: Runtime, job_id: str, error: str, cause: str | None) -> dict[str, str]:
    """Record a step's failure on the job; returns a readable error and cause for the Fail state."""
    message = _cause_message(cause)
    with contextlib.suppress(JobNotFound):  # failed before the job record existed (e.g. an invalid job JSON)
        record_failure(rt, job_id, f"{error}: {message}")
    return {"error": error, "cause": f"job {job_id}: {message}"}


def _cause_message(cause: str | None) -> str:
    """Lambda failures arrive as a JSON cause with errorType/errorMessage; keep the message."""
    if not cause:
        return "no cause given"
    try:
        parsed = json.loads(cause)
    except ValueError:
        return cause
    if isinstance(parsed, dict) and "errorMessage" in parsed:
        return f"{parsed.get('errorType', 'Error')}: {parsed['errorMessage']}"
    return cause


def summary(rt: Runtime, job_id: str) -> dict[str, Any]:
    """The report without the bulky parts, small enough for a state's output."""
    report = report_of(rt.store, job_id)
    return {k: report[k] for k in SUMMARY_KEYS} | {"checks": [
        {k: c[k] for k in ("name", "passed", "detail")} for c in report["checks"]]}
