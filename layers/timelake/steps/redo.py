"""What another engine may have taken from a job, found and made good before anything is committed.

Until stage commits them, a job's unit files are referenced by no snapshot: to every other engine
they are orphans, and orphan-file removal deletes them once they are older than its ``older_than``.
Staged files lose their protection the same way when someone removes the job's branch. So stage
checks that every unit's file exists (a HEAD, not a read) and writes the missing ones again (from the
job's spill, or, for a partition a scan task wrote itself, by running that task again); publish
checks the same before committing whenever no branch protects them. A schema change by another
engine between the plan and the publish either leaves the staged files readable (a new column is null
in them, a renamed column is found by field id) or is refused in one line with main untouched.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow.fs as pafs

from timelake.errors import BackfillError, FilesLost
from timelake.model.contract import Contract
from timelake.ports.files import ObjectIO
from timelake.ports.runtime import Runtime
from timelake.ports.store import JobState, Phase, UnitRecord
from timelake.steps.plan import scan
from timelake.steps.scan import direct_plan, read_result, result_uri

HEADS = 16  # existence checks in flight: on S3 each is a request whose latency, not size, is the cost


def missing_files(paths: list[str], io: Any = None, *, objects: ObjectIO) -> list[str]:
    """Those of ``paths`` that do not exist."""
    if not paths:
        return []
    located = [objects.filesystem(p, io) for p in paths]
    fs = located[0][0]
    if isinstance(fs, pafs.LocalFileSystem):
        infos = fs.get_file_info([path for _, path in located])
    else:
        with ThreadPoolExecutor(max_workers=HEADS) as pool:
            infos = list(pool.map(lambda item: item[0].get_file_info(item[1]), located))
    return [p for p, info in zip(paths, infos, strict=True) if info.type == pafs.FileType.NotFound]


def rewrite_missing(rt: Runtime, job_id: str, table: Any, units: list[UnitRecord]) -> list[str]:
    """Make good the done units whose files are gone; returns their ids. A partition a scan task wrote
    itself (embedded only: it has no spill) is written again here, by running that task again. The
    others become pending, the job goes back to its write step and `FilesLost` says so: the embedded
    runner writes them at once, on AWS the resumed workflow's write map does (the stage function may
    not write data files)."""
    done = [u for u in units if u.status == "done" and u.result.get("path")]
    gone = set(missing_files([u.result["path"] for u in done], table.io, objects=rt.objects))
    lost = [u for u in done if u.result["path"] in gone]
    if not lost:
        return []
    by_name = _direct_units(rt, job_id, [u.unit_id for u in lost])
    rt.store.reopen_units(job_id, [u.unit_id for u in lost])
    for task in sorted({task for task, _ in by_name.values()}):
        fs, path = rt.objects.filesystem(result_uri(rt, job_id, task))
        fs.delete_file(path)  # a finished task returns its stored result: this one must run again
        scan(rt, job_id, task)
        result = read_result(rt, job_id, task)
        assert result is not None, "the scan just ran: its result is stored"
        partitions = {key.name: part for key, part in result.partitions.items()}
        for unit_id, (owner, name) in by_name.items():
            if owner == task:
                direct = partitions[name].direct
                assert direct is not None, "a unit of the direct plan: the scan wrote its file"
                rt.store.complete_unit(job_id, unit_id, direct)
    spilled = [u.unit_id for u in lost if u.unit_id not in by_name]
    if spilled:
        rt.store.update_job(job_id, Phase.PLANNED)
        raise FilesLost(f"job {job_id}: the files of {len(spilled)} written unit(s) (first: {spilled[0]}) were deleted "
                        f"before staging (another engine's orphan-file removal?); they are pending again: "
                        f"timelake backfill resume {job_id} writes them")
    return [u.unit_id for u in lost]


def _direct_units(rt: Runtime, job_id: str, unit_ids: list[str]) -> dict[str, tuple[int, str]]:
    """Of ``unit_ids``, those a scan task wrote itself: unit id -> (task, partition name)."""
    job = rt.store.get_job(job_id)
    if not job.state.get("direct_partitions"):
        return {}
    wanted = {unit_id.removesuffix("-0of1"): unit_id for unit_id in unit_ids if unit_id.endswith("-0of1")}
    found = {}
    for task in range(len(job.state.get("scan_tasks", []))):
        names = set(direct_plan(rt, job_id, task)) & set(wanted)
        if not names:
            continue
        result = read_result(rt, job_id, task)
        written = {key.name for key, part in (result.partitions.items() if result else []) if part.direct is not None}
        found.update({wanted[name]: (task, name) for name in names & written})
    if found and str(job.spec.get("source", "")).startswith("<"):
        raise BackfillError(f"job {job_id}: the files of {len(found)} unit(s) (first: {next(iter(found))}) were deleted "
                            f"before staging, and the job's source was data in memory, which cannot be read again: "
                            f"abort the job (timelake backfill abort {job_id}) and submit it again")
    return found


def require_files(rt: Runtime, job_id: str, table: Any, state: JobState, staged: list[Any]) -> None:
    """Publish, before its first commit: every staged file exists. While the job's branch holds its
    staging snapshot no engine deletes them; without it (someone removed the branch) they are orphans,
    and a publish of a missing file would leave main unreadable. Missing files are written again and
    the job goes back to stage: resume stages and validates them before they are published."""
    branch = table.metadata.refs.get(state.get("branch", ""))
    if branch is not None and branch.snapshot_id == state.get("staged_snapshot_id"):
        return
    gone = missing_files([f.file_path for f in staged], table.io, objects=rt.objects)
    if not gone:
        return
    rt.store.update_job(job_id, Phase.WRITTEN)  # resume stages again, and stage writes the missing units again first
    raise BackfillError(
        f"job {job_id}: {len(gone)} staged file(s) (first: {gone[0]}) were deleted after branch {state.get('branch')} "
        f"was removed from the table by someone else; nothing was published: timelake backfill resume {job_id} "
        f"writes, stages and validates them again")


def require_branch(rt: Runtime, job_id: str, table: Any, state: JobState) -> None:
    """Validation, first: the job's branch still holds its staging snapshot. If someone removed the branch
    (or moved it), the staged files are unprotected and the snapshot may be gone: the job goes back to
    stage, which commits the units' files again (writing any that cleanup took)."""
    branch = state.get("branch", "")
    ref = table.metadata.refs.get(branch)
    if state.get("staged_snapshot_id") is None or (ref is not None and ref.snapshot_id == state["staged_snapshot_id"]):
        return
    rt.store.update_job(job_id, Phase.WRITTEN)
    what = "removed from" if ref is None else "moved to another snapshot in"
    raise BackfillError(f"job {job_id}: branch {branch} was {what} table {'.'.join(table.name())} by someone else "
                        f"after staging; nothing was published: timelake backfill resume {job_id} stages the job's files again")


def refuse_drift(planned: Any, table: Any, contract: Contract, job_id: str) -> None:
    """Publish, before each commit: refuse, in one line and with main untouched, a schema change since
    the plan that the staged files cannot follow. A new optional column is null in them and a renamed
    column is found by its field id, so those go on; a dropped column they hold, a renamed key or time
    column (the table's properties still name the old one) or a new required column does not."""
    now, then = table.schema(), planned.schema()
    if now.schema_id == then.schema_id:
        return
    ids = {f.field_id for f in now.fields}
    keys = {contract.time_column, *contract.series_key, *contract.dedup_key}
    change = None
    for field in then.fields:
        if field.field_id not in ids:
            change = f"column '{field.name}' was dropped"
        elif field.name in keys and now.find_field(field.field_id).name != field.name:
            change = f"column '{field.name}' was renamed to '{now.find_field(field.field_id).name}'"
        if change:
            break
    new = [f for f in now.fields if f.required and f.field_id not in {g.field_id for g in then.fields}]
    if change is None and new:
        change = f"required column '{new[0].name}' was added"
    if change is not None:
        raise BackfillError(
            f"job {job_id}: {change} in table {'.'.join(table.name())} since the job was planned (schema "
            f"{then.schema_id} -> {now.schema_id}), and its staged files cannot follow; nothing was published: "
            f"abort the job (timelake backfill abort {job_id}) and submit it again")
