"""Building Iceberg DataFiles from files we wrote, and committing them as one snapshot.

Writers never commit; stage and publish each make exactly one snapshot from the files the units
recorded. pyiceberg writes every added file into one manifest of the table's current spec, which is
wrong for files of an older (coarser) partition spec, so `_MultiSpecAppend` writes one manifest per
spec. It subclasses a private pyiceberg class: pyiceberg is pinned and
tests/model/test_commit.py fails if that class changes shape.
"""

from __future__ import annotations

import json
import random
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.io.pyarrow import (
    compute_statistics_plan, data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import Transaction
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update.snapshot import _FastAppendFiles, _OverwriteFiles
from pyiceberg.typedef import Record

from timelake.ports.files import filesystem

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.expressions import BooleanExpression

T = TypeVar("T")
COMMIT_ATTEMPTS = 10
JOB_PROPERTY = "timelake.job-id"
STEP_PROPERTY = "timelake.step"
CHUNK_PROPERTY = "timelake.chunk"
NAN_COUNTS = b"timelake.nan-value-counts"  # Parquet footer key: NaNs per float column, by name (Parquet has no such statistic)


def data_file(table: IcebergTable, path: str, spec_id: int, partition_value: int, size: int | None = None) -> DataFile:
    """A DataFile for a Parquet file we wrote, with column statistics read from its footer only. With
    the file's ``size`` (its writer knows it), the footer is read in one request; otherwise the store
    is asked for the size first (on S3, a HEAD per file)."""
    fs, local = filesystem(path)
    if size is None:
        with fs.open_input_file(local) as handle:
            size, metadata = handle.size(), pq.read_metadata(handle)
    else:
        metadata = ds.ParquetFileFormat().make_fragment(local, filesystem=fs, file_size=size).metadata
    schema = table.schema()
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, table.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    serialized = stats.to_serialized_dict()
    nans = json.loads((metadata.metadata or {}).get(NAN_COUNTS, b"{}"))
    serialized["nan_value_counts"] = {**(serialized.get("nan_value_counts") or {}),
                                      **{schema.find_field(name).field_id: n for name, n in nans.items()}}
    result = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(partition_value),
        file_size_in_bytes=size,
        sort_order_id=_sort_order_id(table),
        equality_ids=None,
        key_metadata=None,
        **serialized,
    )
    result.spec_id = spec_id  # from_args does not keep it; the manifest writer needs it
    return result


def _sort_order_id(table: IcebergTable) -> int | None:
    """The table's sort order id, if our files follow it: the writers sort by series key, time, then
    the other dedup columns (`Contract.sort_columns`); an order that is an ascending identity
    prefix of that is one they satisfy. Otherwise None (unknown), never a wrong claim."""
    from timelake.model.contract import Contract

    order = table.sort_order()
    if order.is_unsorted:
        return None
    try:
        contract = Contract.from_table(table)
    except ValueError:
        return None
    names = contract.sort_columns
    schema = table.schema()
    fields = [(schema.find_column_name(f.source_id), str(f.transform), f.direction.name) for f in order.fields]
    return order.order_id if fields == [(n, "identity", "ASC") for n in names[:len(fields)]] else None


def data_files(table: IcebergTable, items: Iterable[tuple[str, int, int, int]]) -> list[DataFile]:
    """Footers are small reads; on object storage they are latency-bound, so read them concurrently."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda item: data_file(table, *item), items))


def append_files(
    tx: Transaction, table: IcebergTable, files: list[DataFile], branch: str | None, properties: dict[str, str]
) -> int:
    """Add ``files`` (of any partition specs) to ``branch`` as one snapshot inside ``tx``; returns its id.
    ``branch=None`` makes a snapshot no ref points to yet (staging on a table whose main is empty)."""
    producer = _MultiSpecAppend(
        operation=Operation.APPEND, transaction=tx, io=table.io, branch=branch, snapshot_properties=properties
    )
    for f in files:
        producer.append_data_file(f)
    producer.commit()
    return producer.snapshot_id


def overwrite_files(
    tx: Transaction, table: IcebergTable, deleted: list[DataFile], added: list[DataFile], branch: str | None,
    properties: dict[str, str],
) -> int:
    """Remove ``deleted`` and add ``added`` (of any partition specs) as ONE overwrite snapshot inside
    ``tx``; returns its id. Each file keeps its own spec: a reader time-travelling to the snapshot
    before sees the old files, the snapshot itself the new ones, nothing in between."""
    producer = _MultiSpecOverwrite(
        operation=Operation.OVERWRITE, transaction=tx, io=table.io, branch=branch, snapshot_properties=properties
    )
    for f in deleted:
        producer.delete_data_file(f)
    for f in added:
        producer.append_data_file(f)
    producer.commit()
    return producer.snapshot_id


class _PerSpec:
    """Added files go to one manifest per partition spec (pyiceberg writes them all with the current
    spec), and the summary counts each file with its own spec."""

    def _added_manifests(self: Any) -> list[ManifestFile]:
        by_spec: dict[int, list[DataFile]] = defaultdict(list)
        for f in self._added_data_files:
            by_spec[f.spec_id].append(f)
        added = []
        for spec_id, files in sorted(by_spec.items()):
            with self.new_manifest_writer(spec=self.spec(spec_id)) as writer:
                for f in files:
                    writer.add(ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                        sequence_number=None, file_sequence_number=None, data_file=f,
                    ))
            added.append(writer.to_manifest_file())
        return added

    def _summary(self: Any, snapshot_properties: dict[str, str] = {}) -> Summary:  # noqa: B006 (pyiceberg's signature)
        metadata = self._transaction.table_metadata
        collector = SnapshotSummaryCollector()
        for f in self._added_data_files:
            collector.add_file(data_file=f, partition_spec=metadata.specs()[f.spec_id], schema=metadata.schema())
        for f in self._deleted_data_files:
            collector.remove_file(data_file=f, partition_spec=metadata.specs()[f.spec_id], schema=metadata.schema())
        previous = metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id is not None else None
        return update_snapshot_summaries(
            summary=Summary(operation=self._operation, **collector.build(), **snapshot_properties),
            previous_summary=previous.summary if previous is not None else None,
        )


class _MultiSpecAppend(_PerSpec, _FastAppendFiles):
    """A fast append whose added files go to one manifest per partition spec."""

    def _manifests(self) -> list[ManifestFile]:
        return self._added_manifests() + self._existing_manifests()


class _MultiSpecOverwrite(_PerSpec, _OverwriteFiles):
    """An overwrite whose added files go to one manifest per partition spec; pyiceberg writes the
    deleted entries and rewrites the existing manifests, each in its own spec already."""

    def _manifests(self) -> list[ManifestFile]:
        added, self._added_data_files = self._added_data_files, []
        try:
            rest = super()._manifests()
        finally:
            self._added_data_files = added
        return self._added_manifests() + rest


def added_files(table: IcebergTable, snapshot_id: int) -> list[DataFile]:
    """The data files a snapshot added (read from its manifests; no data read)."""
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None:
        raise ValueError(f"snapshot {snapshot_id} not found in table {'.'.join(table.name())}")
    files = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot_id:
                files.append(entry.data_file)
    return files


def marker_on_main(table: IcebergTable, job_id: str, chunk: str, base: int | None) -> list[int] | None:
    """Snapshot ids of this job's chunk commit if it is already on main (walks back to the plan's base)."""
    found = []
    for snapshot in since(table, base):
        summary = snapshot.summary or {}
        if summary.get(JOB_PROPERTY) == job_id and summary.get(CHUNK_PROPERTY) == chunk:
            found.append(snapshot.snapshot_id)
    return sorted(found) or None


def since(table: IcebergTable, base: int | None) -> list[Snapshot]:
    """Main's snapshots newer than ``base``, newest first."""
    snapshots, snapshot = [], table.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id != base:
        snapshots.append(snapshot)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    return snapshots


def ancestors(table: IcebergTable) -> set[int]:
    """Ids of main's current snapshot and all its ancestors still in the metadata."""
    return {s.snapshot_id for s in since(table, None)}


def forget_job_snapshots(table: IcebergTable, job_id: str) -> list[int]:
    """Remove this job's snapshots that main does not need (staging and canary snapshots) from the
    table metadata; returns their ids. No file is deleted: pyiceberg 0.12's expiry only edits the
    metadata (tests/steps/test_metadata_hygiene.py checks every file main references still exists).

    Why: Java's ExpireSnapshots (Spark, Athena VACUUM, the Glue optimizer) deletes every file a
    non-ancestor snapshot added when that snapshot expires, and publish re-adds the staged files to
    main in new manifests. A staging snapshot left behind would take the live files with it; an
    aborted job's one would point at files abort deleted. Call after the job's branch is removed
    (a branch head cannot be expired)."""
    def attempt(current: IcebergTable) -> list[int]:
        heads = {ref.snapshot_id for ref in current.metadata.refs.values()}
        needed = ancestors(current) | heads
        ids = [s.snapshot_id for s in current.snapshots()
               if (s.summary or {}).get(JOB_PROPERTY) == job_id and s.snapshot_id not in needed]
        if not ids:
            return ids
        try:
            current.maintenance.expire_snapshots().by_ids(ids).commit()
        except ValueError as exc:  # the catalog applies the removal to ITS latest metadata: a racing
            if "does not exist" not in str(exc):  # abort of the same job expired one first
                raise
            return attempt(current.refresh())
        return ids

    return with_retry(table.refresh(), attempt, f"forget the snapshots of job {job_id}")


def is_conflict(exc: BaseException) -> bool:
    """A concurrent commit won the race. pyiceberg 0.12 reports a commit built on metadata that another
    branch's commit has moved on as a ValueError about sequence numbers, and does not retry it."""
    return isinstance(exc, CommitFailedException | ValidationException) or (
        isinstance(exc, ValueError) and "sequence number" in str(exc)
    )


def without_blind_retries(table: IcebergTable) -> IcebergTable:
    """The same table, whose transactions fail on a concurrent commit instead of being replayed.

    pyiceberg replays a failed commit on the new main without asking the caller; publish must
    re-check the rows live writers just committed before it tries again, so it retries itself.
    Only this in-memory handle changes: no property is written to the table.
    """
    properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    return IcebergTable(table._identifier, table.metadata.model_copy(update={"properties": properties}),
                        table.metadata_location, table.io, table.catalog)


def with_retry(table: IcebergTable, attempt: Callable[[IcebergTable], T], what: str, attempts: int = COMMIT_ATTEMPTS) -> T:
    """Run ``attempt`` on fresh table metadata until it commits, with jittered backoff on conflicts."""
    for n in range(attempts):
        try:
            return attempt(table)
        except Exception as exc:
            if not is_conflict(exc) or n == attempts - 1:
                raise
            time.sleep(min(1.0, 0.02 * 2**n) * (0.5 + random.random()))
            table = table.refresh()
    raise AssertionError("unreachable")


def swap(table: IcebergTable, row_filter: "BooleanExpression | None", rows: "pa.Table", what: str) -> None:
    """Delete the rows matching ``row_filter`` and append ``rows`` in ONE commit, so a reader sees the
    old rows or the new ones, never a mix. A conflict rebuilds the whole swap on fresh metadata
    rather than letting pyiceberg replay the append onto rows it never saw."""
    def attempt(current: IcebergTable) -> None:
        with without_blind_retries(current).transaction() as tx:
            if row_filter is not None:
                with warnings.catch_warnings():  # an empty range to clear is normal here, not a mistake
                    warnings.filterwarnings("ignore", "Delete operation did not match any records")
                    tx.delete(row_filter)
            if rows.num_rows:
                tx.append(rows)

    with_retry(table, attempt, what)
