"""Publish: apply the staged files onto the CURRENT main in one atomic commit (or one per chunk).

Exactly once: every publish commit carries the job id and chunk in its snapshot summary, written in
the same commit as the data, so a retry or resume that finds its marker on main skips the commit.
Live ingestion keeps committing meanwhile: before each commit the rows live writers added in the
chunk's range since the plan are re-checked: they win over staged rows with the same key, and replace
mode keeps them although it deletes the rest of the range.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable

from timelake.errors import BackfillError
from timelake.followup import completion, provenance
from timelake.model.commit import (
    CHUNK_PROPERTY, JOB_PROPERTY, STEP_PROPERTY, ManifestCopy, added_files, collector_paused, data_file, data_files,
    forget_job_snapshots, is_conflict, marker_on_main, overwrite_files, since, staged_manifests, with_retry, without_blind_retries,
)
from timelake.model.contract import Contract
from timelake.model.faults import checkpoint
from timelake.model.layout import PartitionKey, file_bounds, micros, time_filter
from timelake.model.spec import JobSpec
from timelake.model.timeutil import floor_to, iso, next_boundary
from timelake.ports.events import BACKFILL_PUBLISHED
from timelake.ports.files import filesystem
from timelake.ports.runtime import Runtime
from timelake.steps.abort import ALL_COMMITTED, IN_FLIGHT, claim_commit, claim_publish, start_publish
from timelake.steps.write import drop_existing, write_parquet

PUBLISH_ATTEMPTS = 50  # live writers may commit every few ms; each retry only re-checks the newest commits


@dataclass
class Chunk:
    key: str
    start: int
    end: int
    files: list[DataFile]


def publish(rt: Runtime, job_id: str, max_chunks: int | None = None) -> dict[str, Any]:
    """Publish step. Input: job id (and at most how many chunks to commit in this call, so an
    orchestrator can loop chunk by chunk within Lambda's time limit). Output: ``done`` and snapshot ids."""
    with collector_paused():
        return _publish(rt, job_id, max_chunks)


def _publish(rt: Runtime, job_id: str, max_chunks: int | None) -> dict[str, Any]:
    job = rt.store.get_job(job_id)
    spec = JobSpec.model_validate(job.spec)
    state = job.state
    table = rt.load_table(spec.table)
    contract = Contract.from_table(table)
    units = rt.store.units(job_id)
    # the files stage committed to the branch, as the units recorded them (stage built the same DataFiles
    # from the same records, and validation checked that the branch holds exactly those); once every
    # chunk is on main the staging snapshot may be gone from the metadata (forgotten below)
    staged = data_files(table, [u.result for u in units if u.result.get("path")]) if state.get(
        "staged_snapshot_id") and not state.get(ALL_COMMITTED) else []
    copy = staged_manifests(table, state["staged_snapshot_id"], staged) if staged else None
    written: dict[str, list[DataFile]] = {}  # manifests the chunk commits added -> their files, for the coverage update
    published: dict[str, list[int]] = dict(state.get("published_chunks", {}))
    late = dict(state.get("publish_conflicts", {"rows": 0, "sum": 0.0}))
    replaced = int(state.get("rows_replaced", 0))  # replace mode: rows of main's range the job took over
    start_publish(rt, job_id)
    checkpoint("publish.started")
    committed = 0
    occupied = _planned_spans(table, contract, state) if spec.mode == "replace" and spec.publish_by and not state.get(
        ALL_COMMITTED) else []
    todo = [] if state.get(ALL_COMMITTED) else chunks(staged, contract, spec.publish_by, state["range_start"],
                                                      state["range_end"], occupied)
    if todo:
        rt.store.note_progress(job_id, "publish", {"total": len(todo), "of": "chunks"})  # status counts chunks against it
    for chunk in todo:
        if chunk.key in published:
            continue
        if max_chunks is not None and committed >= max_chunks:
            return {"job_id": job_id, "done": False, "chunks_published": len(published)}
        committed += 1
        table = table.refresh()
        marker = marker_on_main(table, job_id, chunk.key, state.get("base_snapshot_id"))
        if marker is None:
            if not chunk.files and spec.mode != "replace":
                marker = []
            else:
                claim_commit(rt, job_id, chunk.key)
                counts: dict[str, int] = {}
                marker = _commit_chunk(rt, table, job_id, spec, contract, state, chunk, late, counts, copy, written)
                replaced += counts.get("rows_replaced", 0)
                checkpoint("publish.committed")
        published[chunk.key] = marker
        rt.store.update_job(job_id, published_chunks=published, publish_conflicts=late, rows_replaced=replaced,
                            **{IN_FLIGHT: None})
        checkpoint("publish.chunk")
        rt.bus.put(BACKFILL_PUBLISHED, {
            "job_id": job_id, "table": spec.table, "mode": spec.mode, "chunk": chunk.key,
            "start": iso(chunk.start), "end": iso(chunk.end), "snapshot_ids": marker,
            "evaluate_rules": spec.evaluate_rules,
        })
    claim_publish(rt, job_id)

    def drop_branch(current: IcebergTable) -> None:
        if state["branch"] in current.metadata.refs:
            current.manage_snapshots().remove_branch(state["branch"]).commit()

    with_retry(table.refresh(), drop_branch, "remove branch")
    forget_job_snapshots(table, job_id)
    job = rt.store.update_job(job_id, published_chunks=published, publish_conflicts=late)
    provenance.record(rt, job, units)
    rt.store.release_lease(job_id)
    completion.update(rt, spec.table, state["range_start"], state["range_end"], known=written)  # the readers' completion signal
    _drop_spill(rt, job_id)
    rt.store.update_job(job_id, "published")
    return {"job_id": job_id, "done": True, "chunks_published": len(published)}


def chunks(staged: list[DataFile], contract: Contract, publish_by: str | None, start: int, end: int,
           occupied: list[tuple[int, int]] | None = None) -> list[Chunk]:
    """Cut [start, end) into publish chunks; a boundary never falls inside a staged file's partition.

    Only the ``publish_by`` periods that hold staged rows (or, replace mode, ``occupied`` spans of
    main's rows to remove) get a chunk of their own; each stretch between them is one chunk, so a
    day-by-day job over decades costs the days with data, not every calendar day. The cut depends
    only on the staged files and the plan-time spans, so a resume cuts the same chunks."""
    transforms = {t.spec_id: t.transform for t in contract.tiers}
    spans = [PartitionKey(f.spec_id, transforms[f.spec_id], f.partition[0]).range for f in staged]
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
    result = [Chunk(iso(lo) if publish_by else "all", lo, hi, []) for lo, hi in zip(bounds, bounds[1:])]
    firsts = np.array([lo for lo, _ in spans], dtype=np.int64).reshape(-1)
    at = np.maximum(np.searchsorted(np.array(bounds[:-1]), np.maximum(firsts, start), side="right") - 1, 0)
    for f, index in zip(staged, at.tolist()):
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


def _planned_spans(table: IcebergTable, contract: Contract, state: dict[str, Any]) -> list[tuple[int, int]]:
    """[lo, hi) time spans of main's files at the plan that may hold rows of the job's range:
    replace mode removes them chunk by chunk, so their periods need chunks of their own."""
    base = state.get("base_snapshot_id")
    if base is None or table.snapshot_by_id(base) is None:
        return []
    field = table.schema().find_field(contract.time_column)
    planned = table.scan(snapshot_id=base, row_filter=time_filter(contract.time_column, state["range_start"],
                                                                   state["range_end"])).plan_files()
    spans = []
    for task in planned:
        lo, hi = file_bounds(task.file, field)
        spans.append((state["range_start"] if lo is None else lo, state["range_end"] if hi is None else hi + 1))
    return spans


def _commit_chunk(
    rt: Runtime, table: IcebergTable, job_id: str, spec: JobSpec, contract: Contract, state: dict[str, Any],
    chunk: Chunk, late: dict[str, Any], counts: dict[str, int], copy: ManifestCopy | None = None,
    written: dict[str, list[DataFile]] | None = None,
) -> list[int]:
    """One snapshot on main: the chunk's staged files (less rows live writers committed meanwhile),
    and in replace mode, in the same snapshot, the removal of the range's files from before the plan,
    those partly inside it rewritten without the range's rows in their own partition spec (an
    age tier stays a month or a year). Files live writers added since the plan are left alone:
    their rows survive, and win over staged rows with the same key.

    When the chunk adds exactly the staged files (one chunk, no live conflicts), the snapshot lists
    copies of the staging manifests (``copy``) instead of encoding their entries again. ``written``
    receives the manifests the commit added and the files each holds."""
    properties = {JOB_PROPERTY: job_id, STEP_PROPERTY: "publish", CHUNK_PROPERTY: chunk.key,
                  "timelake.range-start": iso(chunk.start), "timelake.range-end": iso(chunk.end),
                  **provenance.summary_properties(rt.store.get_job(job_id))}
    files = chunk.files
    checked: set[int] = set()
    survivors: dict[str, tuple[DataFile | None, int]] = {}  # replace: a partly covered file's rewrite, across attempts
    attempt: dict[str, list[DataFile]] = {}

    def commit(current: IcebergTable) -> None:
        nonlocal files, attempt
        if spec.mode in ("merge", "replace"):
            found = _late_rows(current, job_id, contract, state, chunk, checked)
            files = _drop_late_conflicts(current, contract, files, [rows for _, rows in found], late)
        deleted: list[DataFile] = []
        reuse = copy if copy is not None and len(files) == len(copy.files) and all(map(operator.is_, files, copy.files)) else None
        added = [] if reuse is not None else list(files)
        if spec.mode == "replace":
            replaced = 0
            for f in _replaced_files(current, job_id, contract, state, chunk):
                if f.file_path not in survivors:
                    survivors[f.file_path] = _survivors(current, contract, chunk, f, job_id)
                rest, kept_rows = survivors[f.file_path]
                if rest is not None and kept_rows == f.record_count:
                    continue  # its bounds overlap the chunk but none of its rows lie in it
                deleted.append(f)
                replaced += f.record_count - kept_rows
                added.extend([rest] if rest is not None else [])
            counts["rows_replaced"] = replaced
        current = without_blind_retries(current)
        checkpoint("publish.committing")
        attempt = {}
        if deleted or added or reuse is not None:
            with current.transaction() as tx:
                overwrite_files(tx, current, deleted, added, "main", properties, copy=reuse, written=attempt)

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
                  if s.snapshot_id not in before and (s.summary or {}).get(JOB_PROPERTY) == job_id)


def _late_rows(
    table: IcebergTable, job_id: str, contract: Contract, state: dict[str, Any], chunk: Chunk, checked: set[int],
) -> list[tuple[DataFile, pa.Table]]:
    """The keys of rows live writers committed in the chunk's range after the plan, per data file.

    Snapshots in ``checked`` were handled by an earlier attempt, so a retry after losing a commit race
    reads only the newest; the snapshots read here join ``checked``.
    """
    found = []
    for snapshot in since(table, state.get("base_snapshot_id")):
        if snapshot.snapshot_id in checked or (snapshot.summary or {}).get(JOB_PROPERTY) == job_id:
            continue
        checked.add(snapshot.snapshot_id)
        for f in added_files(table, snapshot.snapshot_id):
            if not _overlaps(table, contract, f, chunk):
                continue
            fs, path = filesystem(f.file_path)
            with fs.open_input_file(path) as handle:
                rows = pq.read_table(handle, columns=list(contract.dedup_key))
            ts = micros(rows, contract.time_column)
            inside = rows.filter(pa.array((ts >= chunk.start) & (ts < chunk.end)))
            if inside.num_rows:
                found.append((f, inside))
    return found


def _replaced_files(
    table: IcebergTable, job_id: str, contract: Contract, state: dict[str, Any], chunk: Chunk,
) -> list[DataFile]:
    """Main's files that may hold rows of the chunk's range (partition and column-bound pruning),
    less those live writers added since the plan: replace mode takes over the range as it was planned."""
    live = {f.file_path for snapshot in since(table, state.get("base_snapshot_id"))
            if (snapshot.summary or {}).get(JOB_PROPERTY) != job_id for f in added_files(table, snapshot.snapshot_id)}
    if table.current_snapshot() is None:
        return []
    planned = table.scan(row_filter=time_filter(contract.time_column, chunk.start, chunk.end)).plan_files()
    return [t.file for t in planned if t.file.file_path not in live]


def _survivors(table: IcebergTable, contract: Contract, chunk: Chunk, f: DataFile, job_id: str) -> tuple[DataFile | None, int]:
    """The rows of ``f`` outside the chunk, written to a new file in f's own partition and spec (its
    rows stay sorted, being a subset of a sorted file); with how many there are. A file wholly inside
    the range is not read."""
    lo, hi = file_bounds(f, table.schema().find_field(contract.time_column))
    if lo is not None and hi is not None and lo >= chunk.start and hi < chunk.end:
        return None, 0
    fs, path = filesystem(f.file_path)
    with fs.open_input_file(path) as handle:
        rows = pq.read_table(handle)
    ts = micros(rows, contract.time_column)
    rest = rows.filter(pa.array((ts < chunk.start) | (ts >= chunk.end)))
    if rest.num_rows in (0, rows.num_rows):
        return (None if rest.num_rows == 0 else f), rest.num_rows
    new_path = f.file_path.removesuffix(".parquet") + f"-rest-{job_id}-{chunk.start}.parquet"
    write_parquet(rest, new_path, table.properties)
    return data_file(table, new_path, f.spec_id, f.partition[0]), rest.num_rows


def _drop_late_conflicts(
    table: IcebergTable, contract: Contract, files: list[DataFile], live: list[pa.Table], late: dict[str, Any],
) -> list[DataFile]:
    """Rows live writers committed in the chunk's range after the plan win over staged rows with the same key.

    Affected staged files are rewritten without those rows (a new path, so the staged file stays intact
    for a retry); the counts land in the report as conflicts found at publish.
    """
    if not live:
        return files
    existing = pa.concat_tables(live)
    result = []
    for f in files:
        fs, path = filesystem(f.file_path)
        with fs.open_input_file(path) as handle:
            rows = pq.read_table(handle)
        kept, dropped, dropped_sum = drop_existing(rows, existing, contract)
        if not dropped:
            result.append(f)
            continue
        late["rows"] += dropped
        late["sum"] += dropped_sum
        if kept.num_rows:
            new_path = f.file_path.removesuffix(".parquet") + f"-live{len(kept)}.parquet"
            write_parquet(kept, new_path, table.properties)
            result.append(data_file(table, new_path, f.spec_id, f.partition[0]))
    return result


def _overlaps(table: IcebergTable, contract: Contract, f: DataFile, chunk: Chunk) -> bool:
    """From the manifest's column bounds: can this file hold rows in the chunk's range?"""
    lo, hi = file_bounds(f, table.schema().find_field(contract.time_column))
    return lo is None or hi is None or (lo < chunk.end and hi >= chunk.start)


def _drop_spill(rt: Runtime, job_id: str) -> None:
    fs, path = filesystem(rt.staging_path(job_id, "spill"))
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass

