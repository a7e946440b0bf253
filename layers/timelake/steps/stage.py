"""Stage: ONE commit adds every unit's file to branch ``backfill/<job>``; readers of main see nothing.

Idempotent: if the branch head already is this job's staging snapshot, the step only records it.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.table import Table as IcebergTable

from timelake import memory
from timelake.errors import BackfillError
from timelake.model.commit import (
    JOB_PROPERTY, STEP_PROPERTY, append_files, data_files, transaction, with_retry,
    without_blind_retries,
)
from timelake.model.faults import checkpoint
from timelake.ports.files import ObjectIO
from timelake.ports.runtime import Runtime
from timelake.ports.store import Phase
from timelake.steps import diff, failures
from timelake.steps.plan import fork_branch, job_table
from timelake.steps.redo import rewrite_missing


def stage(rt: Runtime, job_id: str) -> dict[str, Any]:
    """Stage step. Input: job id. Output: the staging snapshot id and file count."""
    with memory.collector_paused():
        return _stage(rt, job_id)


def _stage(rt: Runtime, job_id: str) -> dict[str, Any]:
    checkpoint("stage.started")
    job = rt.store.get_job(job_id)
    units = rt.store.units(job_id)
    pending = [u.unit_id for u in units if u.status != "done"]
    if pending:
        cause = failures.first(rt, job_id, pending)
        raise BackfillError(f"job {job_id}: {len(pending)} unit(s) not written"
                            + (f"; {cause}" if cause else f" yet (first: {pending[0]}); resume the job"))
    table = job_table(rt, job)
    branch = job.state["branch"]
    head = table.snapshot_by_name(branch)
    if not _is_staged(head, job_id, "stage") and rewrite_missing(rt, job_id, table, units):
        units = rt.store.units(job_id)
    written = [u.result for u in units if u.result.get("path")]
    canary = job.state.get("canary_snapshot_id")
    below = canary if canary is not None and head is not None and head.snapshot_id == canary else None
    if below is not None:  # an approved canary: its files stay staged beneath, the rest go on top
        on_branch = {rt.store.unit(job_id, u).result.get("path") for u in job.state["canary"]["units"]}
        written = [r for r in written if r["path"] not in on_branch]
    if below is not None and not written:  # the canary staged every file there is
        snapshot_id, below = canary, None
    else:
        snapshot_id = stage_files(table, job_id, branch, written, "stage", objects=rt.objects)
    files = len(written) + (len(on_branch - {None}) if below is not None else 0)
    diff.conclude(rt, job_id)  # every unit is written: the job's diff is known before anything reaches main
    rt.store.update_job(job_id, Phase.STAGED, staged_snapshot_id=snapshot_id, staged_on=below, files=files)
    return {"job_id": job_id, "staged_snapshot_id": snapshot_id, "files": files}


def _is_staged(head: Any, job_id: str, step: str) -> bool:
    return head is not None and head.summary is not None and head.summary.get(JOB_PROPERTY) == job_id \
        and head.summary.get(STEP_PROPERTY) == step


def stage_files(table: IcebergTable, job_id: str, branch: str, written: list[dict[str, Any]], step: str, *,
                objects: ObjectIO) -> int | None:
    """One commit of the files of ``written`` (units' results) onto ``branch``, marked with ``step``
    so a retry that finds its marker at the branch head only returns it. On a table whose main was
    empty at the plan (or whose branch someone removed) the branch is created at that commit (main
    gets no commit before publish)."""
    head = table.snapshot_by_name(branch)
    if head is not None and _is_staged(head, job_id, step):
        return head.snapshot_id
    if not written:
        return None
    files = data_files(table, written, objects=objects)
    forked = branch in table.metadata.refs

    def commit(current: IcebergTable) -> int:
        with transaction(without_blind_retries(current)) as tx:
            return append_files(tx, current, files, branch if forked else None, {JOB_PROPERTY: job_id, STEP_PROPERTY: step},
                                inherit=True)  # publish lists copies of these manifests (`ManifestCopy`)

    snapshot_id = with_retry(table, commit, step)
    if not forked:
        fork_branch(table.refresh(), branch, snapshot_id)
    checkpoint(f"{step}.committed")
    return snapshot_id
