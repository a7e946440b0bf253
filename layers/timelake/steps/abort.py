"""Abort: drop an unpublished job without a trace on main.

Removes the branch, deletes the job's staged files that no publish commit put on main, deletes its
scratch files and releases the lease. A job whose chunks are partly published keeps those chunks
(they are on main, committed atomically); only what never reached main is removed.
"""

from __future__ import annotations

from typing import Any

from timelake.errors import BackfillError
from timelake.followup import completion
from timelake.model.commit import JOB_PROPERTY, added_files, with_retry
from timelake.model.spec import JobSpec
from timelake.ports.files import filesystem
from timelake.ports.runtime import Runtime
from timelake.steps.plan import clear_staging

ABORTABLE_AFTER = {"published": "it is published (its rows are on main)", "dry_run_complete": "a dry run leaves nothing to abort"}


def request_abort(rt: Runtime, job_id: str) -> None:
    """Ask a running embedded job to stop at its next step or unit boundary."""
    rt.store.update_job(job_id, abort_requested=True)


def abort(rt: Runtime, job_id: str) -> dict[str, Any]:
    """Abort step. Input: job id. Output: what was removed. Idempotent."""
    job = rt.store.get_job(job_id)
    if job.phase in ABORTABLE_AFTER:
        raise BackfillError(f"job {job_id} cannot be aborted: {ABORTABLE_AFTER[job.phase]}")
    spec = JobSpec.model_validate(job.spec)
    table = rt.load_table(spec.table)
    on_main = {f.file_path for s in table.snapshots() if (s.summary or {}).get(JOB_PROPERTY) == job_id
               and (s.summary or {}).get("timelake.step") == "publish" for f in added_files(table, s.snapshot_id)}
    branch = job.state.get("branch") or f"backfill/{job_id}"

    def drop_branch(current: Any) -> None:
        if branch in current.metadata.refs:
            current.manage_snapshots().remove_branch(branch).commit()

    with_retry(table, drop_branch, "remove branch")
    deleted = 0
    for unit in rt.store.units(job_id):
        path = unit.result.get("path")
        if path and path not in on_main:
            deleted += _delete(path)
    clear_staging(rt, job_id)
    rt.store.release_lease(job_id)
    if "range_start" in job.state:  # a refresh during the lease may have marked the range backfilling
        completion.update(rt, spec.table, job.state["range_start"], job.state["range_end"], create=False)
    rt.store.update_job(job_id, "aborted", files_deleted=deleted)
    return {"job_id": job_id, "phase": "aborted", "files_deleted": deleted, "files_kept_on_main": len(on_main)}


def _delete(path: str) -> int:
    fs, local = filesystem(path)
    try:
        fs.delete_file(local)
    except FileNotFoundError:
        return 0
    return 1
