"""Building Iceberg DataFiles from files we wrote, and committing them as one snapshot.

Writers never commit; stage and publish each make exactly one snapshot from the files the units
recorded. pyiceberg writes every added file into one manifest of the table's current spec, which is
wrong for files of an older (coarser) partition spec, so the snapshot producers of
`timelake.model.iceberg_private` write one manifest per spec.
"""

from __future__ import annotations

import itertools
import json
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import (
    ArrowScan,
    bin_pack_arrow_table,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    match_metrics_mode,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
    write_file,
)
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DEFAULT_READ_VERSION,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntryStatus,
)
from pyiceberg.partitioning import (
    PartitionField,
    PartitionFieldValue,
    PartitionKey,
    PartitionSpec,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import TableProperties, Transaction, WriteTask
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
)
from pyiceberg.typedef import Record
from pyiceberg.utils.properties import property_as_int

from timelake.model.iceberg_private import (
    ManifestCopy, MultiSpecAppend, MultiSpecOverwrite, all_rows_match, complement, transaction, with_metadata,
)
from timelake.model.layout import micros, split_by_code
from timelake.model.lineage import main_tasks
from timelake.model.timeutil import TRANSFORMS, transform_values
from timelake.ports.files import ObjectIO
from timelake.ports.store import JobState

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression

T = TypeVar("T")
COMMIT_ATTEMPTS = 10
JOB_PROPERTY = "timelake.job-id"
STEP_PROPERTY = "timelake.step"
CHUNK_PROPERTY = "timelake.chunk"
INHERITED_IDS = "timelake.inherited-ids"  # summary: the entries this snapshot added name no snapshot or sequence number
NAN_COUNTS = b"timelake.nan-value-counts"  # Parquet footer key: NaNs per float column, by name (Parquet has no such statistic)


def summary_value(snapshot: Snapshot, key: str) -> str | None:
    """A property of a snapshot's summary; None also for a snapshot without a summary (the spec lets a writer omit it)."""
    return snapshot.summary.get(key) if snapshot.summary is not None else None


def data_file(table: IcebergTable, path: str, spec_id: int, partition_value: int | Record, *, objects: ObjectIO) -> DataFile:
    """A DataFile for a Parquet file we wrote, with column statistics read from its footer only.
    ``partition_value``: the time partition's value, or a whole partition record (a rewrite of another
    engine's file, whose spec may have more fields)."""
    fs, local = objects.filesystem(path)
    with fs.open_input_file(local) as handle:
        size = handle.size()
        metadata = pq.read_metadata(handle)
    return _data_file(table, path, spec_id, partition_value, size, _statistics(table, metadata), _sort_order_id(table))


def file_statistics(table: IcebergTable, metadata: pq.FileMetaData) -> dict[str, Any]:
    """The Iceberg column statistics of a file we wrote, from the writer's own footer metadata, as JSON
    (bounds in hex): a unit records them with its file, so stage builds its DataFile without a read."""
    stats = _statistics(table, metadata)
    return {**stats, **{key: {str(k): v for k, v in (stats[key] or {}).items()} for key in _COUNTS},
            **{key: {str(k): v.hex() for k, v in (stats[key] or {}).items()} for key in _BOUNDS}}


def data_file_from_result(table: IcebergTable, result: dict[str, Any], sort_order_id: int | None | bool = False, *,
                          objects: ObjectIO) -> DataFile:
    """The DataFile of a unit's file, from the statistics its writer recorded (a result without them,
    from an older writer, reads the footer). ``sort_order_id``: the table's (`_sort_order_id`), when
    the caller builds many."""
    stats = result.get("file_statistics")
    if stats is None:
        return data_file(table, result["path"], result["spec_id"], result["value"], objects=objects)
    decoded = dict(stats)
    for key in _COUNTS:
        if (counts := stats.get(key)) is not None:
            decoded[key] = {int(k): v for k, v in counts.items()}
    for key in _BOUNDS:
        if (bounds := stats.get(key)) is not None:
            decoded[key] = {int(k): bytes.fromhex(v) for k, v in bounds.items()}
    order = _sort_order_id(table) if sort_order_id is False else sort_order_id
    return _data_file(table, result["path"], result["spec_id"], result["value"], result["bytes"], decoded, order)


_COUNTS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")  # by field id
_BOUNDS = ("lower_bounds", "upper_bounds")  # by field id, Iceberg's single-value serialization


def footer_statistics(table: IcebergTable, path: str, *, objects: ObjectIO) -> dict[str, Any]:
    """A file's column statistics as its own footer holds them, with Iceberg's default metrics whatever the
    table's metrics modes keep in its manifests (``write.metadata.metrics.*``: ``counts`` leaves the bounds
    out, ``none`` the counts too): for the checks that need them where a manifest entry lacks them."""
    fs, local = objects.filesystem(path)
    with fs.open_input_file(local) as handle:
        metadata = pq.read_metadata(handle)
    return _statistics(table, metadata, metrics={TableProperties.DEFAULT_WRITE_METRICS_MODE: INFERRED_MODE})  # every column


def metrics_modes(table: IcebergTable, properties: dict[str, str] | None = None) -> dict[str, str]:
    """The table's metrics modes as Iceberg Java's writers take them (``MetricsConfig.forTable``), spelt as the
    properties pyiceberg's statistics plan reads, which knows the two properties alone: the columns of the
    sort order (those a transform keeps in order) keep ``truncate(16)`` bounds under a default of ``counts`` or
    ``none``, so files stay prunable by what they are sorted on; without a default, a table of more columns
    than ``write.metadata.metrics.max-inferred-column-defaults`` (100) keeps metrics for that many and none
    for the rest; a misspelt mode falls back as Java's does (to ``truncate(16)``, a column's to the default),
    where pyiceberg's plan stopped the write. ``properties``: others to read instead of the table's."""
    props = table.properties if properties is None else properties
    schema = table.schema()
    modes: dict[str, str] = {}
    default = _mode(props.get(TableProperties.DEFAULT_WRITE_METRICS_MODE), INFERRED_MODE)
    if TableProperties.DEFAULT_WRITE_METRICS_MODE not in props:
        limit = _inferred_limit(props)
        if len(schema.columns) > limit:
            first = Schema(*schema.columns[:limit])
            modes.update((name, INFERRED_MODE) for i in first.field_ids if (name := first.find_column_name(i)) is not None)
            default = "none"
    promoted = "truncate(16)" if default.lower() in ("none", "counts") else default
    for field in table.sort_order().fields:
        name = schema.find_column_name(field.source_id)
        if field.transform.preserves_order and name is not None:
            modes[name] = promoted
    for key, value in props.items():
        if key.startswith(METRICS_COLUMN):
            modes[key.removeprefix(METRICS_COLUMN)] = _mode(value, default)
    return {TableProperties.DEFAULT_WRITE_METRICS_MODE: default, **{METRICS_COLUMN + name: mode for name, mode in modes.items()}}


INFERRED_MODE = "truncate(16)"  # Iceberg's default metrics mode
METRICS_COLUMN = TableProperties.METRICS_MODE_COLUMN_CONF_PREFIX + "."
MAX_INFERRED = "write.metadata.metrics.max-inferred-column-defaults"


def _mode(value: str | None, fallback: str) -> str:
    if value is None:
        return fallback
    try:
        match_metrics_mode(value)
    except ValueError:
        return fallback
    return value


def _inferred_limit(props: dict[str, str]) -> int:
    try:
        limit = int(props.get(MAX_INFERRED, "100"))
    except ValueError:
        return 100
    return limit if limit >= 0 else 100


def _statistics(table: IcebergTable, metadata: pq.FileMetaData, metrics: dict[str, str] | None = None) -> dict[str, Any]:
    """The DataFile statistics of a file we wrote, as the table's metrics modes keep them (``metrics``: other
    properties to take the modes from)."""
    schema = table.schema()
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, metrics_modes(table, metrics)),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    serialized = stats.to_serialized_dict()
    nans = json.loads((metadata.metadata or {}).get(NAN_COUNTS, b"{}"))
    serialized["nan_value_counts"] = {**(serialized.get("nan_value_counts") or {}),
                                      **{schema.find_field(name).field_id: n for name, n in nans.items()}}
    return serialized


def _data_file(table: IcebergTable, path: str, spec_id: int, partition_value: int | Record, size: int, stats: dict[str, Any],
               sort_order_id: int | None) -> DataFile:
    values = {"content": DataFileContent.DATA, "file_path": path, "file_format": FileFormat.PARQUET,
              "partition": partition_value if isinstance(partition_value, Record) else Record(partition_value), "file_size_in_bytes": size, "sort_order_id": sort_order_id,
              "equality_ids": None, "key_metadata": None, **stats}
    result = DataFile(*[values.get(name, default) for name, default in _DATA_FILE_FIELDS])  # = DataFile.from_args,
    result.spec_id = spec_id  # from_args does not keep it; the manifest writer needs it   # without its per-field lookups
    return result


_DATA_FILE_FIELDS = tuple((f.name, f.initial_default) for f in DATA_FILE_TYPE[DEFAULT_READ_VERSION].fields)


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


def data_files(table: IcebergTable, results: Iterable[dict[str, Any]], *, objects: ObjectIO) -> list[DataFile]:
    """The DataFiles of units' results. Writers record their files' statistics, so no file is opened;
    footers of results without them are small reads, latency-bound on object storage: read concurrently."""
    order = _sort_order_id(table)
    results = list(results)
    unrecorded = [r for r in results if "file_statistics" not in r]
    with ThreadPoolExecutor(max_workers=16) as pool:
        read = dict(zip(map(id, unrecorded), pool.map(lambda r: data_file_from_result(table, r, order, objects=objects), unrecorded),
                        strict=True))
    return [read[id(r)] if id(r) in read else data_file_from_result(table, r, order, objects=objects) for r in results]


def append_files(
    tx: Transaction, table: IcebergTable, files: list[DataFile], branch: str | None, properties: dict[str, str],
    inherit: bool = False, written: dict[str, list[DataFile]] | None = None,
) -> int:
    """Add ``files`` (of any partition specs) to ``branch`` as one snapshot inside ``tx``; returns its id.
    ``branch=None`` makes a snapshot no ref points to yet (staging on a table whose main is empty).
    ``inherit``: write the entries without snapshot id (format v2 inheritance, marked in the summary),
    so a later commit can list copies of these manifests (`ManifestCopy`). ``written`` receives
    path -> files of every manifest the commit added."""
    inherit = inherit and tx.table_metadata.format_version == 2
    producer = MultiSpecAppend(operation=Operation.APPEND, transaction=tx, io=table.io, branch=branch,
                                snapshot_properties={**properties, **({INHERITED_IDS: "true"} if inherit else {})})
    producer.prepare(inherit=inherit, written=written)
    for f in files:
        producer.append_data_file(f)
    producer.commit()
    return producer.snapshot_id


def overwrite_files(
    tx: Transaction, table: IcebergTable, deleted: list[DataFile], added: list[DataFile], branch: str | None,
    properties: dict[str, str], copy: ManifestCopy | None = None, written: dict[str, list[DataFile]] | None = None,
) -> int:
    """Remove ``deleted`` and add ``added`` (of any partition specs) as ONE overwrite snapshot inside
    ``tx``; returns its id. Each file keeps its own spec: a reader time-travelling to the snapshot
    before sees the old files, the snapshot itself the new ones, nothing in between. ``copy``: more
    added files, as copies of manifests written before; ``written`` as in `append_files`."""
    producer = MultiSpecOverwrite(
        operation=Operation.OVERWRITE, transaction=tx, io=table.io, branch=branch, snapshot_properties=properties
    )
    producer.prepare(copy=copy, written=written)
    for f in deleted:
        producer.delete_data_file(f)
    for f in added:
        producer.append_data_file(f)
    producer.commit()
    return producer.snapshot_id


def staged_manifests(table: IcebergTable, snapshot_id: int, files: list[DataFile]) -> ManifestCopy | None:
    """The manifests snapshot ``snapshot_id`` added, as a `ManifestCopy` of ``files``, if they can be
    listed again: written with inherited ids, only ADDED data entries, one per spec, and as many
    entries per spec as ``files`` has (the staging snapshot holds exactly the units' files, which
    validation checked). None otherwise: the caller writes the entries anew."""
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None or summary_value(snapshot, INHERITED_IDS) != "true":
        return None
    manifests = [m for m in snapshot.manifests(table.io) if m.added_snapshot_id == snapshot_id]
    per_spec: dict[int, int] = defaultdict(int)
    for f in files:
        per_spec[f.spec_id] += 1
    if any(m.content != ManifestContent.DATA or m.existing_files_count or m.deleted_files_count for m in manifests):
        return None
    if {m.partition_spec_id: m.added_files_count for m in manifests} != per_spec or len(manifests) != len(per_spec):
        return None
    return ManifestCopy(manifests, files)


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


def staged_files(table: IcebergTable, state: JobState) -> list[DataFile]:
    """The files a job staged on its branch: those its staging snapshot added, and those of the approved
    canary's snapshot beneath it (``staged_on``), which stage built on rather than staged again."""
    ids = [state.get("staged_on"), state.get("staged_snapshot_id")]
    return [f for snapshot_id in ids if snapshot_id is not None for f in added_files(table, snapshot_id)]


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


def published_property(job_id: str) -> str:
    """The table property a job's publish commits set to the chunk they commit (cleared by `retire`)."""
    return f"timelake.published.{job_id}"


def landed(table: IcebergTable, job_id: str, key: str, keys: list[str]) -> list[int] | None:
    """Whether chunk ``key`` of the job is on main, from the table as it is now: each chunk commit sets
    the job's marker property to its chunk, in the same commit as its rows, and chunks commit in
    ``keys`` order. Properties survive every other engine's maintenance; snapshot summaries do not
    (an expired publish snapshot takes its summary along). Returns the ids of the chunk's commits
    still in the metadata (possibly none), or None when the chunk is not on main."""
    through = table.properties.get(published_property(job_id))
    if through is None or through not in keys or key not in keys or keys.index(through) < keys.index(key):
        return None
    return sorted(s.snapshot_id for s in table.snapshots()
                  if summary_value(s, JOB_PROPERTY) == job_id and summary_value(s, CHUNK_PROPERTY) == key)


def retire(table: IcebergTable, job_id: str, branch: str | None) -> list[int]:
    """Remove what a job left in the table's metadata, in ONE commit: its branch, its snapshots main does
    not need (staging and canary snapshots) and its publish marker. Returns the ids of the snapshots
    removed. No file is deleted: pyiceberg 0.12's expiry only edits the metadata
    (tests/steps/test_metadata_hygiene.py checks every file main references still exists).

    Why: Java's ExpireSnapshots (Spark, Athena VACUUM, the Glue optimizer) deletes every file a
    non-ancestor snapshot added when that snapshot expires, if the table has one ref
    (`IncrementalFileCleanup`), and publish re-adds the staged files to main in new manifests. A
    staging snapshot left behind, even for the moment between the branch's removal and its own,
    would take the live files with it; an aborted job's one would point at files abort deleted."""
    from pyiceberg.table.update.snapshot import ExpireSnapshots, ManageSnapshots

    marker = published_property(job_id)

    def attempt(current: IcebergTable) -> list[int]:
        current = current.refresh()
        has_branch = branch is not None and branch in current.metadata.refs
        heads = {ref.snapshot_id for name, ref in current.metadata.refs.items() if name != branch}
        needed = ancestors(current) | heads
        ids = [s.snapshot_id for s in current.snapshots()
               if summary_value(s, JOB_PROPERTY) == job_id and s.snapshot_id not in needed]
        if not (has_branch or ids or marker in current.properties):
            return ids
        tx = transaction(without_blind_retries(current))
        if has_branch and branch is not None:
            ManageSnapshots(tx).remove_branch(branch).commit()
        if ids:  # expiring a snapshot removes it from the metadata only (see above)
            ExpireSnapshots(tx).by_ids(ids).commit()
        if marker in current.properties:
            tx.remove_properties(marker)
        try:
            tx.commit_transaction()
        except ValueError as exc:  # the catalog applies the removal to ITS latest metadata: a racing
            if "does not exist" not in str(exc):  # abort of the same job removed a snapshot first
                raise
            return attempt(current)
        return ids

    return with_retry(table, attempt, f"retire job {job_id} from the table metadata")


def is_conflict(exc: BaseException) -> bool:
    """A concurrent commit won the race, or holds the catalog. pyiceberg 0.12 reports a commit built on
    metadata that another branch's commit has moved on as a ValueError about sequence numbers, and does
    not retry it; a SQLite catalog that another engine keeps locked past the busy timeout raises
    SQLAlchemy's OperationalError "database is locked"."""
    return isinstance(exc, CommitFailedException | ValidationException) or (
        isinstance(exc, ValueError) and "sequence number" in str(exc)
    ) or (type(exc).__name__ == "OperationalError" and "database is locked" in str(exc))


def without_blind_retries(table: IcebergTable) -> IcebergTable:
    """The same table, whose transactions fail on a concurrent commit instead of being replayed.

    pyiceberg replays a failed commit on the new main without asking the caller; publish must
    re-check the rows live writers just committed before it tries again, so it retries itself.
    Only this in-memory handle changes: no property is written to the table.
    """
    properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
    return with_metadata(table, properties=properties)


def with_retry(table: IcebergTable, attempt: Callable[[IcebergTable], T], what: str, attempts: int = COMMIT_ATTEMPTS) -> T:
    """Run ``attempt`` on fresh table metadata until it commits, with jittered backoff on conflicts. The
    refresh is part of an attempt: a catalog another engine holds locked may refuse the read too."""
    for n in range(attempts):
        try:
            return attempt(table.refresh() if n else table)
        except Exception as exc:
            if not is_conflict(exc) or n == attempts - 1:
                raise
            time.sleep(min(1.0, 0.02 * 2**n) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def swap(
    table: IcebergTable, row_filter: BooleanExpression | None, rows: pa.Table | list[DataFile], what: str,
    properties: dict[str, str] | None = None, check: Callable[[IcebergTable], None] | None = None,
) -> IcebergTable:
    """Delete the rows matching ``row_filter`` and add ``rows`` (Arrow rows, or data files written
    already) in ONE commit, so a reader sees the old rows or the new ones, never a mix. A conflict
    rebuilds the whole swap on fresh metadata rather than letting pyiceberg replay the append onto rows
    it never saw; ``check`` sees that fresh metadata first and raises to give up. Returns the table as
    committed, for the caller's next commit (the handle it passed in is stale now).

    The files are written here (`write_rows`), not by pyiceberg's delete and append: those partition
    rows with pyiceberg-core, a 32 MB native library that the rollup Lambda, which also needs DuckDB,
    has no room for. A file whose rows all match is dropped unread; one where only some match is
    rewritten without them, like pyiceberg's copy-on-write delete."""
    def attempt(current: IcebergTable) -> IcebergTable:
        if check is not None:
            check(current)
        handle = without_blind_retries(current)
        removed, kept = _matching_files(handle, row_filter) if row_filter is not None else ([], [])
        if isinstance(rows, list):
            added = rows + (write_rows(handle, pa.concat_tables(kept)) if kept else [])
        else:
            added = write_rows(handle, pa.concat_tables([t.cast(rows.schema) for t in (*kept, rows)]))
        if removed or added:
            with transaction(handle) as tx:
                if removed:
                    overwrite_files(tx, handle, removed, added, MAIN_BRANCH, properties or {})
                else:
                    append_files(tx, handle, added, MAIN_BRANCH, properties or {})
        return handle  # a commit replaces the handle's metadata with the catalog's, retry settings included

    return with_retry(table, attempt, what)


def _matching_files(table: IcebergTable, row_filter: BooleanExpression) -> tuple[list[DataFile], list[pa.Table]]:
    """The files of main holding rows that match ``row_filter``, and the rows of theirs that do not."""
    schema = table.schema()
    all_match = all_rows_match(schema, row_filter)
    keep = complement(schema, row_filter)
    removed, kept = [], []
    for task in main_tasks(table, row_filter):
        if all_match(task.file) and not task.delete_files:
            removed.append(task.file)
            continue
        old = ArrowScan(table.metadata, table.io, schema, AlwaysTrue()).to_table([task])
        left = old.filter(keep)
        if left.num_rows < old.num_rows:
            removed.append(task.file)
            kept.append(left)
    return removed, kept


def write_rows(table: IcebergTable, rows: pa.Table) -> list[DataFile]:
    """Data files of ``rows`` in the table's current spec, written by pyiceberg's writer (file names,
    target size, field ids, statistics) with the partition values computed here: identity, or the
    hour/day/month/year of a timestamp (`transform_values`, the transforms every table of ours uses)."""
    if not rows.num_rows:
        return []
    metadata = table.metadata
    spec, schema = metadata.spec(), metadata.schema()
    task_schema = pyarrow_to_schema(rows.schema, name_mapping=schema.name_mapping, format_version=metadata.format_version)
    target = cast(int, property_as_int(metadata.properties, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
                                       TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT))  # an int default: an int
    write_uuid, counter = uuid.uuid4(), itertools.count()
    tasks = [WriteTask(write_uuid, next(counter), task_schema, batches, partition_key=key)
             for key, part in _partitions(spec, schema, rows) for batches in bin_pack_arrow_table(part, target)]
    files = list(write_file(table.io, metadata, iter(tasks)))
    for f in files:
        f.spec_id = metadata.default_spec_id  # as in `data_file`: from_args drops it
    return files


def _partitions(spec: PartitionSpec, schema: Schema, rows: pa.Table) -> list[tuple[PartitionKey | None, pa.Table]]:
    """``rows`` split by partition, each part in its input order."""
    if spec.is_unpartitioned():
        return [(None, rows)]
    values = np.stack([_partition_values(field, schema, rows) for field in spec.fields], axis=1)
    keys, codes = np.unique(values, axis=0, return_inverse=True)
    return [(PartitionKey([PartitionFieldValue(field, int(v)) for field, v in zip(spec.fields, keys[code], strict=True)], spec, schema), part)
            for code, part in split_by_code(rows, codes.reshape(-1))]


def _partition_values(field: PartitionField, schema: Schema, rows: pa.Table) -> np.ndarray:
    name = schema.find_column_name(field.source_id)
    if name is None:
        raise ValueError(f"partition field {field.name}: its source column (id {field.source_id}) is not in the schema")
    column, transform = rows.column(name), str(field.transform)
    if transform not in TRANSFORMS or not pa.types.is_timestamp(column.type):
        raise ValueError(f"cannot write rows partitioned by {transform}({name}): the engine partitions by the "
                         f"{'/'.join(TRANSFORMS)} of a timestamp")
    if column.null_count:
        raise ValueError(f"column '{name}' has nulls, so some rows have no {transform} partition")
    return transform_values(micros(rows.set_column(rows.schema.get_field_index(name), name,
                                                   pc.cast(column, pa.timestamp("us", column.type.tz))), name), transform)
