"""Every use of pyiceberg's private API, in one module.

The engine extends pyiceberg where its public API stops: snapshot producers whose added files go to
one manifest per partition spec (pyiceberg writes all of them with the current spec, wrong for the
files of an older, coarser tier) and that can list byte copies of manifests written before; a
manifest writer fed a block of entries at a time; the evaluators pyiceberg's own copy-on-write delete
uses; a table handle over changed metadata; the Arrow-to-Iceberg schema conversion that assigns
fresh field ids; planning without a residual filter per file; the object-storage layout's hash. Each of those reaches into names pyiceberg marks private, so they are all here:
pyiceberg is pinned, and tests/model/test_iceberg_private.py checks every name this module uses (its
signature, or the attributes read, and what it does), so that an upgrade fails there first and
nowhere else.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.expressions.visitors import _StrictMetricsEvaluator, bind
from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, _expression_to_complementary_pyarrow, visit_pyarrow
from pyiceberg.manifest import (
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import ManifestGroupPlanner, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.locations import ObjectStoreLocationProvider
from pyiceberg.table.snapshots import SnapshotSummaryCollector, Summary, UpdateMetrics, update_snapshot_summaries
from pyiceberg.table.update.snapshot import _FastAppendFiles, _OverwriteFiles

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression

PARTITION_SUMMARY_LIMIT = "write.summary.partition-limit"  # Iceberg's property; pyiceberg's default, 0, writes none
MANIFEST_BLOCK = 1000  # manifest entries per Avro block


def with_metadata(table: IcebergTable, **update: Any) -> IcebergTable:
    """The same table with some metadata fields changed in this in-memory handle only (a schema or
    spec of the past, retry settings): what a commit through it sends are its own changes."""
    return IcebergTable(table._identifier, table.metadata.model_copy(update=update), table.metadata_location,
                        table.io, table.catalog)


class _MetadataOnce(Transaction):
    """A transaction that builds its metadata once per change instead of once per read.

    pyiceberg's ``Transaction.table_metadata`` replays the staged updates onto a deep copy of the
    whole metadata, snapshot log included, on every read, and a snapshot producer reads it a dozen
    times per commit: against a table with a few hundred snapshots (a live writer's minute-by-minute
    appends) that was 0.7 s of each publish attempt, long enough for every attempt to lose the race
    to a writer committing every 50 ms. Both inputs are replaced, never mutated, when they change
    (``_updates`` is a tuple, a refresh makes a new metadata object), so their identity keys the copy.
    """

    _cached: tuple[object, object, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        if self._cached is None or self._cached[0] is not base or self._cached[1] is not updates:
            self._cached = (base, updates, super().table_metadata)
        return self._cached[2]


def transaction(table: IcebergTable) -> Transaction:
    """``table.transaction()`` for the engine's commits, whose metadata reads cost one copy per change."""
    return _MetadataOnce(table)


def object_store_hash(name: str) -> str:
    """The directories Iceberg's object-storage layout hashes a data file's name into (murmur3, as Iceberg
    Java's provider computes it): pyiceberg's provider keeps the hash private, and places files without the
    table's context that Java's adds under a data path outside the table (`layout.data_location`)."""
    return str(ObjectStoreLocationProvider._compute_hash(name))


def fresh_schema(schema: pa.Schema) -> Schema:
    """An Iceberg schema for an Arrow schema without field ids, with fresh ids assigned."""
    return assign_fresh_schema_ids(visit_pyarrow(schema, _ConvertToIcebergWithoutIDs()))


class ResidualFreePlanner(ManifestGroupPlanner):
    """pyiceberg's planning without working out each file's residual filter: it binds the filter again
    for every data file, three quarters of planning a day-partitioned range (34 of 45 ms for 120 files,
    under the interpreter lock while the other writers wait), and only pyiceberg's ``count()`` reads it
    (the engine filters rows by time as it reads them). Each task's residual is the whole filter, which
    is never wrong."""

    def _build_residual_evaluator(self, spec_id: int) -> Callable[[DataFile], Any]:
        return lambda data_file: _WholeFilter(self.row_filter)


@dataclass(frozen=True)
class _WholeFilter:
    """A residual evaluator that leaves the whole filter to every file."""

    row_filter: Any

    def residual_for(self, partition: Any) -> Any:
        return self.row_filter


def all_rows_match(schema: Schema, row_filter: BooleanExpression) -> Callable[[DataFile], bool]:
    """Whether every row of a data file matches ``row_filter``, from its column bounds alone. A file
    whose row count is unknown (-1, as some writers leave it) never does: the 0.12.0 release says so,
    pyiceberg's development branch of the same version number does not, and a file taken as matching
    is deleted whole."""
    evaluate = _StrictMetricsEvaluator(schema, row_filter).eval
    return lambda file: file.record_count >= 0 and evaluate(file)


def complement(schema: Schema, row_filter: BooleanExpression) -> Any:
    """The Arrow expression for the rows ``row_filter`` does NOT match: those pyiceberg's own
    copy-on-write delete keeps."""
    return _expression_to_complementary_pyarrow(bind(schema, row_filter, case_sensitive=True), schema)


@dataclass
class ManifestCopy:
    """Manifests another snapshot added, to be listed again by a new one: together they hold exactly
    ``files``, one manifest per spec, and their entries inherit snapshot id and sequence numbers from
    the manifest list (`staged_manifests` checks both). Publish lists copies of the staging
    snapshot's manifests instead of encoding the same 10,000 entries a second time (most of a commit's
    cost). A byte copy, not the same path: pyiceberg caches a manifest list's entries by manifest path
    process-wide, so one path under two snapshots would read as the first snapshot's under both."""

    manifests: list[ManifestFile]
    files: list[DataFile]


class _PerSpec:
    """Added files go to one manifest per partition spec (pyiceberg writes them all with the current
    spec), and the summary counts each file with its own spec. Manifests of a `ManifestCopy` are
    listed as copies; ``written`` learns what every added manifest holds."""

    _inherit = False
    _copy: ManifestCopy | None = None
    _written: dict[str, list[DataFile]] | None = None

    def prepare(self: Any, inherit: bool = False, copy: ManifestCopy | None = None,
                written: dict[str, list[DataFile]] | None = None) -> None:
        self._inherit, self._copy, self._written = inherit, copy, written

    def _added_manifests(self: Any) -> list[ManifestFile]:
        by_spec: dict[int, list[DataFile]] = defaultdict(list)
        for f in self._added_data_files:
            by_spec[f.spec_id].append(f)
        added = []
        snapshot_id = None if self._inherit else self._snapshot_id
        for spec_id, files in sorted(by_spec.items()):
            with self.new_manifest_writer(spec=self.spec(spec_id)) as writer:
                _add_all(writer, [ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id,
                    sequence_number=None, file_sequence_number=None, data_file=f,
                ) for f in files])
            added.append(self._record(writer.to_manifest_file(), files))
        if self._copy is not None:
            copied: dict[int, list[DataFile]] = defaultdict(list)
            for f in self._copy.files:
                copied[f.spec_id].append(f)
            added += [self._record(self._copied(m), copied[m.partition_spec_id]) for m in self._copy.manifests]
        return added

    def _record(self: Any, manifest: ManifestFile, files: list[DataFile]) -> ManifestFile:
        if self._written is not None:
            self._written[manifest.manifest_path] = files
        return manifest

    def _copied(self: Any, source: ManifestFile) -> ManifestFile:
        """A byte copy of ``source`` at a path of this commit (a failed attempt deletes it, as it
        deletes the manifests it wrote), listed as added by this snapshot: its entries inherit
        this snapshot's id and sequence number."""
        output = self.new_manifest_output()
        with self._io.new_input(source.manifest_path).open() as handle:
            data = handle.read()
        with output.create(overwrite=True) as out:
            out.write(data)
        return ManifestFile.from_args(
            manifest_path=output.location, manifest_length=len(data), partition_spec_id=source.partition_spec_id,
            content=source.content, sequence_number=UNASSIGNED_SEQ, min_sequence_number=UNASSIGNED_SEQ,
            added_snapshot_id=self._snapshot_id, added_files_count=source.added_files_count, existing_files_count=0,
            deleted_files_count=0, added_rows_count=source.added_rows_count, existing_rows_count=0,
            deleted_rows_count=0, partitions=source.partitions, key_metadata=source.key_metadata,
        )

    def _summary(self: Any, snapshot_properties: dict[str, str] = {}) -> Summary:  # noqa: B006 (pyiceberg's signature)
        metadata = self._transaction.table_metadata
        limit = int(metadata.properties.get(PARTITION_SUMMARY_LIMIT, 0))
        collector = SnapshotSummaryCollector(limit) if limit > 0 else _PartitionCounter()
        specs, schema = metadata.specs(), metadata.schema()
        added = itertools.chain(self._added_data_files, self._copy.files if self._copy is not None else ())
        if isinstance(collector, _PartitionCounter):
            collector.add_files(added, specs, schema)
        else:
            for f in added:
                collector.add_file(data_file=f, partition_spec=specs[f.spec_id], schema=schema)
        for f in self._deleted_data_files:
            collector.remove_file(data_file=f, partition_spec=specs[f.spec_id], schema=schema)
        previous = metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id is not None else None
        return update_snapshot_summaries(
            summary=Summary(operation=self._operation, **collector.build(), **snapshot_properties),
            previous_summary=previous.summary if previous is not None else None,
        )


def _add_all(writer: Any, entries: list[ManifestEntry]) -> None:
    """``ManifestWriter.add_entry`` for ADDED entries, many at a time: its bookkeeping, then one Avro
    block per MANIFEST_BLOCK entries. pyiceberg writes a block (and compresses it) per entry, which
    was a third of writing a 10,000-file manifest here."""
    writer._added_files += len(entries)
    writer._added_rows += sum(e.data_file.record_count for e in entries)
    writer._partitions.extend(e.data_file.partition for e in entries)
    for start in range(0, len(entries), MANIFEST_BLOCK):
        writer._writer.write_block([writer.prepare_entry(e) for e in entries[start:start + MANIFEST_BLOCK]])


class _PartitionCounter(SnapshotSummaryCollector):
    """The summary pyiceberg writes when the table asks for no per-partition summaries (the default):
    only their count is kept, so partitions are counted by value instead of each file's partition being
    formatted as a path (a fifth of a 10,000-file commit here)."""

    # keyed by (spec id, *partition values), not by path: with no partition summaries build() only counts the keys
    partition_metrics: defaultdict[tuple[Any, ...], UpdateMetrics]  # type: ignore[assignment]

    def update_partition_metrics(self, partition_spec: Any, file: DataFile, is_add_file: bool, schema: Any) -> None:
        key = (partition_spec.spec_id, *iter(file.partition))  # iter: a Record iterates by __getitem__
        if key not in self.partition_metrics:
            self.partition_metrics[key] = UpdateMetrics()

    def add_files(self, files: Iterable[DataFile], specs: dict[int, PartitionSpec], schema: Schema) -> None:
        """``add_file`` of many files, data files counted inline: 10,000 calls through pyiceberg's
        collector were a tenth of a publish."""
        metrics, partitions = self.metrics, self.partition_metrics
        for f in files:
            if f.content != DataFileContent.DATA:
                self.add_file(data_file=f, partition_spec=specs[f.spec_id], schema=schema)
                continue
            metrics.added_file_size += f.file_size_in_bytes
            metrics.added_data_files += 1
            metrics.added_records += f.record_count
            if len(f.partition) > 0 and (key := (f.spec_id, *iter(f.partition))) not in partitions:
                partitions[key] = UpdateMetrics()


class MultiSpecAppend(_PerSpec, _FastAppendFiles):
    """A fast append whose added files go to one manifest per partition spec."""

    def _manifests(self) -> list[ManifestFile]:
        return self._added_manifests() + self._existing_manifests()


class MultiSpecOverwrite(_PerSpec, _OverwriteFiles):
    """An overwrite whose added files go to one manifest per partition spec; pyiceberg writes the
    deleted entries and rewrites the existing manifests, each in its own spec already."""

    def _manifests(self) -> list[ManifestFile]:
        added, self._added_data_files = self._added_data_files, []
        try:
            rest = super()._manifests()
        finally:
            self._added_data_files = added
        return self._added_manifests() + rest


