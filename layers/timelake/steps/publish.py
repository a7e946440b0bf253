"""Publish: apply the staged files onto the CURRENT main in one atomic commit (or one per chunk).

Exactly once: every publish commit sets the job's marker property to its chunk, in the same commit as
the data, so a retry or resume that finds the marker at or past a chunk skips it. The marker is in the
table's current metadata, where other engines' snapshot expiry, compaction and manifest rewrites leave
it; the job id and chunk also go into the snapshot summary, for provenance. Live ingestion keeps
committing meanwhile: before each commit the rows other writers added in the chunk's range since the
plan (`lineage`) are re-checked: they win over staged rows with the same key, and replace mode keeps
them although it deletes the rest of the range.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask
from pyiceberg.table import Table as IcebergTable

from timelake import memory
from timelake.errors import BackfillError
from timelake.followup import completion, provenance
from timelake.model.commit import (
    CHUNK_PROPERTY, JOB_PROPERTY, STEP_PROPERTY, ManifestCopy, data_file, data_files, is_conflict, landed,
    overwrite_files, published_property, retire, staged_manifests, summary_value, transaction, with_retry,
    without_blind_retries,
)
from timelake.model.contract import Contract
from timelake.model.faults import checkpoint
from timelake.model.layout import PartitionKey, file_bounds, micros, read_task, time_filter
from timelake.model.lineage import Lineage, Origin, PlanMark, planned_view
from timelake.model.spec import JobSpec
from timelake.model.timeutil import floor_to, iso, next_boundary
from timelake.ports.events import BACKFILL_PUBLISHED
from timelake.ports.files import ObjectIO
from timelake.ports.runtime import Runtime
from timelake.ports.store import JobState, Phase
from timelake.steps import diff
from timelake.steps.abort import claim_commit, claim_publish, start_publish
from timelake.steps.plan import CHUNKS, read_json, write_json
from timelake.steps.redo import missing_files, refuse_drift, require_files
from timelake.steps.write import drop_existing, existing_mask, write_parquet

PUBLISH_ATTEMPTS = 50  # live writers may commit every few ms; each retry only re-checks the newest commits


@dataclass
class Chunk:
    key: str
    start: int
    end: int
    files: list[DataFile]


def publish(rt: Runtime, job_id: str, max_chunks: int | None = None,
            between: Callable[[], object] | None = None) -> dict[str, Any]:
    """Publish step. Input: job id (and at most how many chunks to commit in this call, so an
    orchestrator can loop chunk by chunk within Lambda's time limit). Output: ``done`` and snapshot ids.
    ``between`` runs before each chunk still to commit: it may wait (quiet hours) or raise (an abort)."""
    with memory.collector_paused():
        return _publish(rt, job_id, max_chunks, between)


def _publish(rt: Runtime, job_id: str, max_chunks: int | None, between: Callable[[], object] | None) -> dict[str, Any]:
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    state = job.state
    table = rt.load_table(spec.table)
    planned = planned_view(table, state)  # the staged files' schema and spec, whatever changed since
    contract = Contract.from_table(planned)
    units = rt.store.units(job_id)
    done = bool(state.get("publish_committed"))
    # the files stage committed to the branch, as the units recorded them (stage built the same DataFiles
    # from the same records, and validation checked that the branch holds exactly those); once every
    # chunk is on main the staging snapshot may be gone from the metadata (forgotten below)
    staged_id = state.get("staged_snapshot_id")
    staged = (data_files(planned, [u.result for u in units if u.result.get("path")], objects=rt.objects)
              if staged_id and not done else [])
    copy = staged_manifests(table, staged_id, staged) if staged_id and staged else None
    written: dict[str, list[DataFile]] = {}  # manifests the chunk commits added -> their files, for the coverage update
    published: dict[str, list[int]] = dict(state.get("published_chunks", {}))
    late = dict(state.get("publish_conflicts", {"rows": 0, "sum": 0.0}))
    replaced = int(state.get("rows_replaced", 0))  # replace mode: rows of main's range the job took over
    start_publish(rt, job_id)
    checkpoint("publish.started")
    committed = 0
    mark = PlanMark.of(state, table)
    todo = [] if done else _chunks(rt, job_id, table, contract, spec, state, staged, mark)
    keys = [c.key for c in todo]
    if todo:
        rt.store.note_progress(job_id, "publish", {"total": len(todo), "of": "chunks"})  # status counts chunks against it
        require_files(rt, job_id, table, state, staged)
    for chunk in todo:
        if chunk.key in published:
            continue
        if max_chunks is not None and committed >= max_chunks:
            return {"job_id": job_id, "done": False, "chunks_published": len(published)}
        if between is not None:
            between()
        committed += 1
        table = table.refresh()
        marker = landed(table, job_id, chunk.key, keys)
        if marker is None:
            if not chunk.files and spec.mode != "replace":
                marker = []
            else:
                refuse_drift(planned, table, contract, job_id)
                claim_commit(rt, job_id, chunk.key)
                counts: dict[str, int] = {}
                marker = _commit_chunk(rt, table, planned, job_id, spec, contract, mark, chunk, late, counts, copy, written)
                replaced += counts.get("rows_replaced", 0)
                checkpoint("publish.committed")
        published[chunk.key] = marker
        rt.store.update_job(job_id, published_chunks=published, publish_conflicts=late, rows_replaced=replaced,
                            committing=None)
        checkpoint("publish.chunk")
        rt.bus.put(BACKFILL_PUBLISHED, {
            "job_id": job_id, "table": spec.table, "mode": spec.mode, "chunk": chunk.key,
            "start": iso(chunk.start), "end": iso(chunk.end), "snapshot_ids": marker,
            "evaluate_rules": spec.evaluate_rules,
        })
    claim_publish(rt, job_id)
    # main holds the job's rows now, so no step reads its scratch files again: they go while the rest of the
    # publish runs (a per-device job's spill over 120 days is a GB, whose pages the kernel took 0.2 s to free)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="timelake-drop") as pool:
        dropped = pool.submit(_drop_spill, rt, job_id)
        retire(table, job_id, state["branch"])
        job = rt.store.update_job(job_id, published_chunks=published, publish_conflicts=late)
        found = diff.load(rt, job_id, "job")
        provenance.record(rt, job, units, found[0] if found else None)
        rt.store.release_lease(job_id)
        completion.update(rt, spec.table, state["range_start"], state["range_end"], known=written)  # the readers' completion signal
        dropped.result()
    rt.store.update_job(job_id, Phase.PUBLISHED)
    return {"job_id": job_id, "done": True, "chunks_published": len(published)}


def _chunks(rt: Runtime, job_id: str, table: IcebergTable, contract: Contract, spec: JobSpec, state: JobState,
            staged: list[DataFile], mark: PlanMark) -> list[Chunk]:
    """The job's publish chunks, cut once and kept in its staging area: a resume must commit exactly the
    chunks the first attempt cut, whatever main looks like by then (`landed` compares chunk keys)."""
    bounds = read_json(rt, job_id, CHUNKS)
    if bounds is None:
        occupied = _planned_spans(table, contract, state, job_id, mark) if spec.mode == "replace" and spec.publish_by else []
        cut = chunks(staged, contract, spec.publish_by, state["range_start"], state["range_end"], occupied)
        write_json(rt, job_id, CHUNKS, [[c.start, c.end] for c in cut])
        return cut
    return chunks(staged, contract, spec.publish_by, state["range_start"], state["range_end"],
                  bounds=[lo for lo, _ in bounds] + [bounds[-1][1]])


def chunks(staged: list[DataFile], contract: Contract, publish_by: str | None, start: int, end: int,
           occupied: list[tuple[int, int]] | None = None, bounds: list[int] | None = None) -> list[Chunk]:
    """Cut [start, end) into publish chunks; a boundary never falls inside a staged file's partition.

    Only the ``publish_by`` periods that hold staged rows (or, replace mode, ``occupied`` spans of
    main's rows to remove) get a chunk of their own; each stretch between them is one chunk, so a
    day-by-day job over decades costs the days with data, not every calendar day. ``bounds``: the
    edges of a cut made before (the staged files are then only assigned to its chunks)."""
    transforms = {t.spec_id: t.transform for t in contract.tiers}
    spans = [PartitionKey(f.spec_id, transforms[f.spec_id], f.partition[0]).range for f in staged]
    if bounds is not None:
        return _assigned(staged, spans, bounds, publish_by)
    bounds = [start]
    if publish_by:
        blocked = _merged(spans)
        edges: set[int] = set()
        for lo, hi in _merged([(max(lo, start), min(hi, end)) for lo, hi in spans + (occupied or []) if lo < end and hi > start]):
            edge = floor_to(lo, publish_by)
            while edge < hi:
                edges.add(edge)
                edge = next_boundary(edge, publish_by)
            edges.add(edge)
        starts = np.array([lo for lo, _ in blocked], dtype=np.int64)
        for edge in sorted(edges):
            at = int(np.searchsorted(starts, edge, side="left")) - 1  # the last blocked span starting before edge
            if start < edge < end and not (at >= 0 and edge < blocked[at][1]):
                bounds.append(edge)
    bounds.append(end)
    return _assigned(staged, spans, bounds, publish_by)


def _assigned(staged: list[DataFile], spans: list[tuple[int, int]], bounds: list[int], publish_by: str | None) -> list[Chunk]:
    start = bounds[0]
    result = [Chunk(iso(lo) if publish_by else "all", lo, hi, []) for lo, hi in pairwise(bounds)]
    firsts = np.array([lo for lo, _ in spans], dtype=np.int64).reshape(-1)
    at = np.maximum(np.searchsorted(np.array(bounds[:-1]), np.maximum(firsts, start), side="right") - 1, 0)
    for f, index in zip(staged, at.tolist(), strict=True):
        result[index].files.append(f)
    return result


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping [lo, hi) spans joined, sorted by start (touching ones stay apart: an edge between
    them is a free boundary)."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _planned_spans(table: IcebergTable, contract: Contract, state: JobState, job_id: str,
                   mark: PlanMark) -> list[tuple[int, int]]:
    """[lo, hi) time spans of main's files that may hold rows of the job's range from before the plan:
    replace mode removes them chunk by chunk, so their periods need chunks of their own."""
    field = table.schema().find_field(contract.time_column)
    lineage = Lineage(table, mark, job_id)
    spans = []
    for task in lineage.tasks(time_filter(contract.time_column, state["range_start"], state["range_end"]), REPLACED):
        lo, hi = file_bounds(task.file, field)
        spans.append((state["range_start"] if lo is None else lo, state["range_end"] if hi is None else hi + 1))
    return spans


def _commit_chunk(
    rt: Runtime, table: IcebergTable, planned: IcebergTable, job_id: str, spec: JobSpec, contract: Contract,
    mark: PlanMark, chunk: Chunk, late: dict[str, Any], counts: dict[str, int], copy: ManifestCopy | None = None,
    written: dict[str, list[DataFile]] | None = None,
) -> list[int]:
    """One snapshot on main: the chunk's staged files (less rows live writers committed meanwhile),
    and in replace mode, in the same snapshot, the removal of the range's rows that were there before
    the plan (compacted since or not), files partly inside it rewritten without the range's rows in
    their own partition spec (an age tier stays a month or a year). Files live writers added since the
    plan are left alone: their rows survive, and win over staged rows with the same key. The same
    commit sets the job's marker property to the chunk (`landed`).

    When the chunk adds exactly the staged files (one chunk, no live conflicts), the snapshot lists
    copies of the staging manifests (``copy``) instead of encoding their entries again. ``written``
    receives the manifests the commit added and the files each holds."""
    properties = {JOB_PROPERTY: job_id, STEP_PROPERTY: "publish", CHUNK_PROPERTY: chunk.key,
                  "timelake.range-start": iso(chunk.start), "timelake.range-end": iso(chunk.end),
                  **provenance.summary_properties(rt.store.get_job(job_id))}
    files = chunk.files
    checked: set[str] = set()
    survivors: dict[str, tuple[bool, DataFile | None, int]] = {}  # replace: a partly covered file's rewrite, across attempts
    absorbed: dict[str, pa.Table] = {}  # replace: a compacted file's rows of live writers, by its path
    attempt: dict[str, list[DataFile]] = {}
    in_chunk = time_filter(contract.time_column, chunk.start, chunk.end)

    def commit(current: IcebergTable) -> None:
        nonlocal files, attempt
        lineage = Lineage(current, mark, job_id)
        found = _late_rows(current, lineage, contract, chunk, checked, spec.mode) if spec.mode in ("merge", "replace") else []
        tasks = lineage.tasks(in_chunk, REPLACED) if spec.mode == "replace" else []
        for task in tasks:  # replace: rows of live writers that a compaction folded into a file of old rows
            path = task.file.file_path
            if lineage.origin(lineage.entries[path]) == Origin.REWRITE and path not in checked:
                checked.add(path)
                absorbed[path] = _absorbed_rows(current, lineage, contract, chunk, task, objects=rt.objects)
                found.append(absorbed[path])
        files = _drop_late_conflicts(planned, contract, files, [t for t in found if t.num_rows], late, objects=rt.objects)
        deleted: list[DataFile] = []
        reuse = copy if copy is not None and len(files) == len(copy.files) and all(map(operator.is_, files, copy.files)) else None
        added = [] if reuse is not None else list(files)
        if spec.mode == "replace":
            replaced = 0
            for task in tasks:
                f = task.file
                if f.file_path not in survivors:
                    survivors[f.file_path] = _survivors(current, contract, chunk, task, job_id, absorbed.get(f.file_path),
                                                        objects=rt.objects)
                remove, rest, inside = survivors[f.file_path]
                if not remove:
                    continue  # its bounds overlap the chunk but none of its rows lie in it
                deleted.append(f)
                replaced += inside
                added.extend([rest] if rest is not None else [])
            counts["rows_replaced"] = replaced
        current = without_blind_retries(current)
        checkpoint("publish.committing")
        attempt = {}
        if deleted or added or reuse is not None:
            with transaction(current) as tx:
                overwrite_files(tx, current, deleted, added, "main", properties, copy=reuse, written=attempt)
                tx.set_properties({published_property(job_id): chunk.key})

    before = {s.snapshot_id for s in table.snapshots()}
    try:
        with_retry(table, commit, f"publish {chunk.key}", attempts=PUBLISH_ATTEMPTS)
    except Exception as exc:
        if is_conflict(exc):
            raise BackfillError(f"job {job_id}: publish of chunk {chunk.key} kept conflicting with other commits: {exc}") from exc
        raise
    if written is not None:
        written.update(attempt)  # the attempt that landed
    table = table.refresh()
    return sorted(s.snapshot_id for s in table.snapshots()
                  if s.snapshot_id not in before and summary_value(s, JOB_PROPERTY) == job_id)


REPLACED = (Origin.PLAN, Origin.REWRITE, Origin.JOB)  # replace mode takes these over in its range; live writers' rows stay


def _late_rows(table: IcebergTable, lineage: Lineage, contract: Contract, chunk: Chunk, checked: set[str],
               mode: str) -> list[pa.Table]:
    """The keys of rows other writers added to main in the chunk's range since the plan, per data file:
    they win over staged rows with the same key. In merge mode that includes the files compactions
    wrote since (rows that were there, perhaps live ones among them: existing rows win either way);
    replace mode takes those over instead.

    Files in ``checked`` were read by an earlier attempt, so a retry after losing a commit race reads
    only the newest; the files read here join ``checked``.
    """
    origins = (Origin.LIVE, Origin.REWRITE) if mode == "merge" else (Origin.LIVE,)
    found = []
    for task in lineage.tasks(time_filter(contract.time_column, chunk.start, chunk.end), origins):
        if task.file.file_path in checked:
            continue
        checked.add(task.file.file_path)
        rows = read_task(table, task, contract.dedup_key)
        ts = micros(rows, contract.time_column)
        inside = rows.filter(pa.array((ts >= chunk.start) & (ts < chunk.end)))
        if inside.num_rows:
            found.append(inside)
    return found


def _absorbed_rows(table: IcebergTable, lineage: Lineage, contract: Contract, chunk: Chunk, task: Any, *,
                   objects: ObjectIO) -> pa.Table:
    """Replace mode, a file a compaction wrote in the chunk's range: the keys of its rows in the chunk that
    live writers added since the plan (read from the files the compaction replaced, which are kept
    until their snapshots expire). Those rows stay, and win over staged rows, like any live row. When
    they cannot be told apart any more (the compaction's snapshot or the files it replaced are gone),
    every row of the file in the chunk is kept as live: a row is never dropped on a guess."""
    replaced = lineage.absorbed(task.file.file_path)
    if replaced is None or missing_files([f.file_path for f in replaced], table.io, objects=objects):
        replaced = None
    parts = [read_task(table, FileScanTask(f), contract.dedup_key) for f in replaced] if replaced is not None else [
        read_task(table, task, contract.dedup_key)]
    rows = pa.concat_tables(parts) if parts else table.schema().select(*contract.dedup_key).as_arrow().empty_table()
    ts = micros(rows, contract.time_column)
    return rows.filter(pa.array((ts >= chunk.start) & (ts < chunk.end)))


def _survivors(table: IcebergTable, contract: Contract, chunk: Chunk, task: Any, job_id: str,
               live: pa.Table | None = None, *, objects: ObjectIO) -> tuple[bool, DataFile | None, int]:
    """Replace mode, a file of main that may hold rows of the chunk: whether it goes, the file of the rows
    that stay that replaces it (its rows outside the chunk, and any of ``live``'s keys: rows of live
    writers a compaction folded in; in its own partition and spec; a subset of a sorted file stays
    sorted), and how many of its rows are replaced. A file wholly inside the range is not read."""
    f = task.file
    lo, hi = file_bounds(f, table.schema().find_field(contract.time_column))
    if lo is not None and hi is not None and lo >= chunk.start and hi < chunk.end and not task.delete_files and not (
            live is not None and live.num_rows):
        return True, None, f.record_count
    rows = read_task(table, task)
    ts = micros(rows, contract.time_column)
    stays = (ts < chunk.start) | (ts >= chunk.end)
    if live is not None and live.num_rows:
        stays |= existing_mask(rows, live.cast(pa.schema([rows.schema.field(n) for n in live.column_names])), contract)
    rest = rows.filter(pa.array(stays))
    inside = rows.num_rows - rest.num_rows
    if inside == 0:
        return False, None, 0
    if rest.num_rows == 0:
        return True, None, inside
    new_path = f.file_path.removesuffix(".parquet") + f"-rest-{job_id}-{chunk.start}.parquet"
    write_parquet(rest, new_path, contract.parquet, objects=objects)
    return True, data_file(table, new_path, f.spec_id, f.partition, objects=objects), inside


def _drop_late_conflicts(
    table: IcebergTable, contract: Contract, files: list[DataFile], live: list[pa.Table], late: dict[str, Any], *,
    objects: ObjectIO,
) -> list[DataFile]:
    """Rows live writers committed in the chunk's range after the plan win over staged rows with the same key.

    Affected staged files are rewritten without those rows (a new path, so the staged file stays intact
    for a retry); the counts land in the report as conflicts found at publish.
    """
    if not live:
        return files
    existing = pa.concat_tables([t.cast(live[0].schema) for t in live])
    result = []
    for f in files:
        fs, path = objects.filesystem(f.file_path, table.io)
        with fs.open_input_file(path) as handle:
            rows = pq.read_table(handle)
        keys = existing.cast(pa.schema([rows.schema.field(name) for name in existing.column_names]))
        kept, dropped, dropped_sum = drop_existing(rows, keys, contract)
        if not dropped:
            result.append(f)
            continue
        late["rows"] += dropped
        late["sum"] += dropped_sum
        if kept.num_rows:
            new_path = f.file_path.removesuffix(".parquet") + f"-live{len(kept)}.parquet"
            write_parquet(kept, new_path, contract.parquet, objects=objects)
            result.append(data_file(table, new_path, f.spec_id, f.partition[0], objects=objects))
    return result


def _drop_spill(rt: Runtime, job_id: str) -> None:
    """The scratch files no later step reads: the spill, and the diff's (its result stays)."""
    fs, path = rt.objects.filesystem(rt.staging_path(job_id, "spill"))
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(path)
    diff.drop_scratch(rt, job_id)

