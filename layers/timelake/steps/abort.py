"""Abort: drop an unpublished job without a trace on main.

Removes the branch, deletes the job's staged files that no publish commit put on main, deletes its
scratch files and releases the lease. A job whose chunks are partly published keeps those chunks
(they are on main, committed atomically); only what never reached main is removed.

Abort and publish never interleave. Both go through one guarded write on the job record
(`JobStore.update_job_if`): publish marks a chunk commit in flight only if no abort was requested,
and abort sets its flag only while no chunk commit is in flight, waiting up to
``ABORT_WAIT_SECONDS`` for one to land. Once the flag is set no commit can start, so the files
abort deletes are exactly those that no commit on main references or ever will.
"""

from __future__ import annotations

import time
from typing import Any

from timelake.errors import Aborted, BackfillError
from timelake.followup import completion
from timelake.model.commit import landed, retire
from timelake.model.lineage import referenced_files
from timelake.model.spec import JobSpec
from timelake.ports.files import ObjectIO, location_key
from timelake.ports.runtime import Runtime
from timelake.ports.store import JobRecord, Phase, UnitRecord
from timelake.steps.plan import chunk_keys, clear_staging
from timelake.steps.scan import direct_plan
from timelake.steps.write import unit_path

ABORTABLE_AFTER = {Phase.PUBLISHED: "it is published (its rows are on main)", Phase.DRY_RUN_COMPLETE: "a dry run leaves nothing to abort"}
ABORT_WAIT_SECONDS = 120.0  # a chunk commit takes well under a second, 50 conflicting retries about a minute
COMMIT_STALE_SECONDS = 900.0  # Lambda's time limit: a commit marked in flight for longer died with its process


class CommitInFlight(BackfillError):
    """A chunk commit to main is in flight: abort must wait for it."""


def request_abort(rt: Runtime, job_id: str) -> None:
    """Ask a running embedded job to stop at its next step or unit boundary, or before its next commit."""
    rt.store.update_job_if(job_id, _abortable, abort_requested=True)


def claim_commit(rt: Runtime, job_id: str, chunk: str) -> None:
    """Publish, before committing ``chunk``: mark the commit in flight, unless an abort came first."""
    rt.store.update_job_if(job_id, _not_aborted, committing={"chunk": chunk, "since": time.time()})


def claim_publish(rt: Runtime, job_id: str) -> JobRecord:
    """Publish, after its last chunk commit: from here the job is published and abort refuses it."""
    return rt.store.update_job_if(job_id, _not_aborted, publish_committed=True, committing=None)


def start_publish(rt: Runtime, job_id: str) -> JobRecord:
    """Publish, on entry: the phase moves to publishing, unless an abort came first."""
    return rt.store.update_job_if(job_id, _not_aborted, Phase.PUBLISHING)


def abort(rt: Runtime, job_id: str, wait: float = ABORT_WAIT_SECONDS) -> dict[str, Any]:
    """Abort step. Input: job id. Output: what was removed. Idempotent.

    Waits up to ``wait`` seconds for a chunk commit in flight to land, then refuses with one line.
    What is on main, and which files may go, is read from the table as it is right before the
    deletes: a file that any snapshot still in the metadata references (main's chunks of this job,
    compacted or not, and anything another ref holds) stays, whatever other engines expired."""
    job = rt.store.get_job(job_id)
    _abortable(job)
    spec = JobSpec.model_validate(job.spec)
    table = rt.load_table(spec.table)
    job = _fence(rt, job, table, wait)
    table = table.refresh()
    keys = chunk_keys(rt, job_id, spec.publish_by)
    chunks = sorted(set(job.state.get("published_chunks", {})) | {k for k in keys if landed(table, job_id, k, keys) is not None})
    retire(table, job_id, job.state.get("branch") or f"backfill/{job_id}")
    written = {path for u in rt.store.units(job_id) if (path := u.result.get("path")) is not None}
    candidates: set[str] = written | set(direct_paths(rt, job, table))
    referenced = {location_key(p) for p in referenced_files(table.refresh())}
    kept = {p for p in candidates if location_key(p) in referenced}
    deleted = sum(_delete(path, table.io, objects=rt.objects) for path in sorted(candidates - kept))
    clear_staging(rt, job_id)
    rt.store.release_lease(job_id)
    if "range_start" in job.state:  # a refresh during the lease may have marked the range backfilling
        completion.update(rt, spec.table, job.state["range_start"], job.state["range_end"], create=False)
    rt.store.update_job(job_id, Phase.ABORTED, files_deleted=deleted, chunks_on_main=chunks)
    return {"job_id": job_id, "phase": Phase.ABORTED, "files_deleted": deleted, "files_kept_on_main": len(kept)}


def direct_paths(rt: Runtime, job: JobRecord, table: Any) -> list[str]:
    """Where scan tasks write the partitions they write themselves: before the cut records them as
    units (or if a task died writing one), only the plan knows these files."""
    paths = []
    for task in range(len(job.state.get("scan_tasks", [])) if job.state.get("direct_partitions") else 0):
        for name, key in direct_plan(rt, job.job_id, task).items():
            unit = UnitRecord(unit_id=f"{name}-0of1", info={"spec_id": key["spec_id"], "value": key["value"]})
            paths.append(unit_path(table, job.job_id, unit))
    return paths


def _fence(rt: Runtime, job: JobRecord, table: Any, wait: float) -> JobRecord:
    """Set the abort flag once no chunk commit is in flight (waiting up to ``wait`` seconds for one).

    A commit counts as landed when its marker is on main (its process may have died before it could
    say so), and as dead after ``COMMIT_STALE_SECONDS``."""
    job_id, deadline = job.job_id, time.monotonic() + wait
    while True:
        flight = rt.store.get_job(job_id).state.get("committing")
        keys = chunk_keys(rt, job_id, job.spec.get("publish_by")) if flight is not None else []
        done = flight is not None and landed(table.refresh(), job_id, flight["chunk"], keys) is not None

        def guard(current: JobRecord) -> None:
            _abortable(current)
            now = current.state.get("committing")
            if now is not None and not (done and now == flight) and time.time() - now["since"] < COMMIT_STALE_SECONDS:  # noqa: B023 (update_job_if calls guard in this iteration)
                raise CommitInFlight(f"job {job_id} is committing chunk {now['chunk']} to main; "
                                     f"abort refused after waiting {wait:g} s, run it again")

        try:
            return rt.store.update_job_if(job_id, guard, abort_requested=True)
        except CommitInFlight:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _abortable(job: JobRecord) -> None:
    if job.phase in ABORTABLE_AFTER:
        raise BackfillError(f"job {job.job_id} cannot be aborted: {ABORTABLE_AFTER[job.phase]}")
    if job.state.get("publish_committed"):
        raise BackfillError(f"job {job.job_id} cannot be aborted: every chunk is on main; it is being published")


def _not_aborted(job: JobRecord) -> None:
    if job.state.get("abort_requested") or job.phase == Phase.ABORTED:
        raise Aborted(f"job {job.job_id} was aborted")


def _delete(path: str, io: Any, *, objects: ObjectIO) -> int:
    fs, local = objects.filesystem(path, io)
    try:
        fs.delete_file(local)
    except FileNotFoundError:
        return 0
    return 1
