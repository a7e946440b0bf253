"""A contract test per private pyiceberg name the engine uses (all of them in
`timelake.model.iceberg_private`): its signature or the attributes read, and what it does. An upgrade of
pyiceberg that moves one of them fails here, by name, before any job can."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pyarrow as pa
import pyiceberg
from pyiceberg.expressions import GreaterThanOrEqual, LessThan
from pyiceberg.expressions.visitors import _StrictMetricsEvaluator
from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, _expression_to_complementary_pyarrow
from pyiceberg.manifest import DataFile, ManifestEntryStatus, ManifestWriter
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import ManifestGroupPlanner, Transaction
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.update.snapshot import _FastAppendFiles, _OverwriteFiles, _SnapshotProducer
from pyiceberg.transforms import DayTransform, MonthTransform

import timelake
from timelake.model import iceberg_private
from timelake.model.commit import _data_file, append_files, overwrite_files, staged_manifests
from timelake.model.iceberg_private import (
    MANIFEST_BLOCK, ManifestCopy, MultiSpecAppend, MultiSpecOverwrite, ResidualFreePlanner, all_rows_match, complement,
    fresh_schema, object_store_hash, transaction, with_metadata,
)

SCHEMA = pa.schema([pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False), pa.field("v", pa.float64())])
DAY_US = 86_400_000_000


def test_the_pinned_version_is_the_one_these_contracts_describe():
    assert pyiceberg.__version__ == "0.12.0"


def _table(lake: timelake.Lake) -> IcebergTable:
    """t.x partitioned by day(ts) in spec 1 and by month(ts) in spec 0, as an age-tiered table is."""
    lake.catalog.create_namespace("t")
    schema = fresh_schema(SCHEMA)
    ts = schema.find_field("ts").field_id
    table = lake.catalog.create_table("t.x", schema=schema, partition_spec=PartitionSpec(
        PartitionField(ts, 1000, MonthTransform(), "ts_month")))
    with table.update_spec() as spec:
        spec.remove_field("ts_month")
        spec.add_field("ts", DayTransform(), "ts_day")
    return table.refresh()


def _file(table: IcebergTable, n: int, spec_id: int, partition: int, rows: int = 10, **stats: object) -> DataFile:
    """A DataFile for the metadata only (no data is read by these commits)."""
    stats = {"record_count": rows, "column_sizes": None, "value_counts": None, "null_value_counts": None,
             "nan_value_counts": None, "lower_bounds": None, "upper_bounds": None, "split_offsets": None, **stats}
    return _data_file(table, f"file:///nowhere/f{n}.parquet", spec_id, partition, 100, stats, None)


def test_table_handle_over_changed_metadata(lake):
    """``Table(identifier, metadata, metadata_location, io, catalog)`` and ``Table._identifier``."""
    table = _table(lake)
    assert list(inspect.signature(IcebergTable.__init__).parameters)[1:6] == [
        "identifier", "metadata", "metadata_location", "io", "catalog"]
    assert table._identifier == ("t", "x")
    changed = with_metadata(table, properties={**table.properties, "k": "v"}, default_spec_id=0)
    assert changed.properties["k"] == "v" and changed.spec().spec_id == 0 and changed.name() == table.name()
    assert "k" not in table.properties and table.spec().spec_id == 1
    assert changed.metadata_location == table.metadata_location and changed.io is table.io


def test_arrow_schema_to_iceberg_with_fresh_ids():
    """``_ConvertToIcebergWithoutIDs``: an Arrow schema without field ids becomes an Iceberg one, ids
    assigned in order, nullability kept."""
    assert inspect.isclass(_ConvertToIcebergWithoutIDs)
    schema = fresh_schema(pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string()),
                                     pa.field("c", pa.timestamp("us", tz="UTC"))]))
    assert [(f.field_id, f.name, f.required, str(f.field_type)) for f in schema.fields] == [
        (1, "a", True, "long"), (2, "b", False, "string"), (3, "c", False, "timestamptz")]


def test_strict_metrics_and_complementary_filter(lake):
    """``_StrictMetricsEvaluator(schema, expr).eval(file)``: True only when every row of a file matches,
    from its bounds; ``_expression_to_complementary_pyarrow(bound, schema)``: the rows that do not match."""
    assert list(inspect.signature(_StrictMetricsEvaluator.__init__).parameters)[1:3] == ["schema", "expr"]
    assert list(inspect.signature(_expression_to_complementary_pyarrow).parameters)[:2] == ["expr", "schema"]
    table = _table(lake)
    schema, field = table.schema(), table.schema().find_field("ts")
    day = datetime(2024, 3, 1, tzinfo=UTC)
    in_day = GreaterThanOrEqual("ts", day.isoformat())
    micros = int(day.timestamp() * 1_000_000)

    def bounded(lo: int, hi: int, rows: int = 10) -> DataFile:
        return _file(table, 0, 1, micros // DAY_US, rows, lower_bounds={field.field_id: lo.to_bytes(8, "little")},
                     upper_bounds={field.field_id: hi.to_bytes(8, "little")}, value_counts={field.field_id: 10},
                     null_value_counts={field.field_id: 0})

    assert all_rows_match(schema, in_day)(bounded(micros, micros + 10)) is True
    assert all_rows_match(schema, in_day)(bounded(micros - 10, micros + 10)) is False
    assert all_rows_match(schema, in_day)(bounded(micros, micros + 10, rows=-1)) is False  # an unknown count: rewrite it
    rows = pa.table({"ts": pa.array([micros - 1, micros, micros + 1], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                     "v": [1.0, 2.0, 3.0]})
    keep = complement(schema, LessThan("ts", day.isoformat()))
    assert rows.filter(keep).column("v").to_pylist() == [2.0, 3.0]


def test_the_planner_builds_residuals_through_the_method_the_residual_free_one_overrides():
    """`ResidualFreePlanner` overrides ``_build_residual_evaluator(spec_id)``, whose result ``plan_files``
    calls per data file with ``residual_for(partition)``; nothing else of pyiceberg's planning changes."""
    assert list(inspect.signature(ManifestGroupPlanner._build_residual_evaluator).parameters) == ["self", "spec_id"]
    plan = inspect.getsource(ManifestGroupPlanner.plan_files)
    assert "self._build_residual_evaluator" in plan and ".residual_for(" in plan
    assert [name for name in vars(ResidualFreePlanner) if not name.startswith("__")] == ["_build_residual_evaluator"]


def test_snapshot_producers_have_the_shape_the_subclasses_use():
    """What `MultiSpecAppend` and `MultiSpecOverwrite` override, call and read on pyiceberg's producers,
    and what `_add_all` reads and writes on its manifest writer."""
    for klass in (_FastAppendFiles, _OverwriteFiles):
        for name in ("_manifests", "_summary", "_existing_manifests", "new_manifest_writer", "new_manifest_output",
                     "spec", "append_data_file", "delete_data_file", "commit", "snapshot_id"):
            assert hasattr(klass, name), f"{klass.__name__}.{name}"
    assert list(inspect.signature(_SnapshotProducer.__init__).parameters)[:7] == [
        "self", "operation", "transaction", "io", "commit_uuid", "snapshot_properties", "branch"]
    assert list(inspect.signature(_SnapshotProducer._summary).parameters) == ["self", "snapshot_properties"]
    assert list(inspect.signature(_SnapshotProducer.new_manifest_writer).parameters) == ["self", "spec"]
    init = inspect.getsource(_SnapshotProducer.__init__)
    for attribute in ("_added_data_files", "_deleted_data_files", "_snapshot_id", "_parent_snapshot_id",
                      "_operation", "_transaction", "_io"):
        assert f"self.{attribute}" in init, attribute
    writer = inspect.getsource(ManifestWriter)
    for attribute in ("self._added_files", "self._added_rows", "self._partitions", "self._writer", "def prepare_entry"):
        assert attribute in writer, attribute
    assert issubclass(MultiSpecAppend, _FastAppendFiles) and issubclass(MultiSpecOverwrite, _OverwriteFiles)


def test_an_append_writes_one_manifest_per_spec_in_blocks(lake):
    """Files of two specs in one commit: a manifest each, in its own spec, every entry read back (more
    than one Avro block of entries), counted in the summary."""
    table = _table(lake)
    month = (2023 - 1970) * 12
    files = [_file(table, i, 1, 19_000 + i % 3) for i in range(MANIFEST_BLOCK + 5)] + [_file(table, -1, 0, month)]
    with table.transaction() as tx:
        snapshot_id = append_files(tx, table, files, "main", {"why": "contract"})
    table = table.refresh()
    snapshot = table.snapshot_by_id(snapshot_id)
    manifests = snapshot.manifests(table.io)
    assert sorted((m.partition_spec_id, m.added_files_count) for m in manifests) == [(0, 1), (1, MANIFEST_BLOCK + 5)]
    entries = [e for m in manifests for e in m.fetch_manifest_entry(table.io)]
    assert len(entries) == len(files) and {e.status for e in entries} == {ManifestEntryStatus.ADDED}
    assert {e.data_file.spec_id for e in entries} == {0, 1}
    assert snapshot.summary["added-data-files"] == str(len(files)) and snapshot.summary["why"] == "contract"
    assert snapshot.summary["changed-partition-count"] == "4"


def test_an_overwrite_lists_copies_of_manifests_and_deletes_in_one_snapshot(lake):
    """`ManifestCopy`: a later commit lists byte copies of the manifests an earlier one wrote with
    inherited ids, and its entries then read as added by that later snapshot."""
    table = _table(lake)
    old = [_file(table, 900, 1, 19_000)]
    with table.transaction() as tx:
        append_files(tx, table, old, "main", {})
    table = table.refresh()
    staged = [_file(table, i, 1, 19_001) for i in range(3)]
    with table.transaction() as tx:
        staging = append_files(tx, table, staged, None, {}, inherit=True)
    table = table.refresh()
    copy = staged_manifests(table, staging, staged)
    assert isinstance(copy, ManifestCopy) and len(copy.manifests) == 1
    written: dict[str, list[DataFile]] = {}
    with table.transaction() as tx:
        published = overwrite_files(tx, table, old, [], "main", {}, copy=copy, written=written)
    table = table.refresh()
    live = {e.data_file.file_path: e.snapshot_id for m in table.current_snapshot().manifests(table.io)
            for e in m.fetch_manifest_entry(table.io)}
    assert live == {f.file_path: published for f in staged}
    assert list(written.values()) == [staged]
    assert table.current_snapshot().summary["deleted-data-files"] == "1"


def test_a_transaction_copies_its_metadata_once_per_change(lake):
    """``Transaction.table_metadata`` (a property), ``Transaction._table`` and ``Transaction._updates``
    (a tuple, replaced when an update is staged): repeated reads give one copy until something is
    staged or the table is refreshed, and the copy is what pyiceberg's own property gives."""
    assert isinstance(inspect.getattr_static(Transaction, "table_metadata"), property)
    table = _table(lake)
    tx = transaction(table)
    assert isinstance(tx, Transaction) and tx._table is table and isinstance(tx._updates, tuple)
    first = tx.table_metadata
    assert tx.table_metadata is first and first == Transaction(table).table_metadata
    assert first is not table.metadata  # a copy: pyiceberg's producers may hold it while the table moves on
    tx.set_properties({"k": "v"})
    changed = tx.table_metadata
    assert changed is not first and changed.properties["k"] == "v" and "k" not in first.properties
    tx.commit_transaction()
    assert table.refresh().properties["k"] == "v"
    other = transaction(table)
    held = other.table_metadata
    with transaction(lake.catalog.load_table("t.x")) as elsewhere:  # another handle moves the table on
        elsewhere.set_properties({"k": "w"})
    assert other.table_metadata is held and held.properties["k"] == "v"
    table.refresh()  # a refreshed table is new metadata: the next read copies it
    assert other.table_metadata is not held and other.table_metadata.properties["k"] == "w"


def test_every_private_name_is_used_here_only():
    """The module is the one place: no other engine module imports a pyiceberg name with a leading
    underscore."""
    import ast
    from pathlib import Path

    root = Path(iceberg_private.__file__).parent.parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "iceberg_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyiceberg"):
                offenders += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert offenders == []


def test_the_object_storage_hash_is_the_one_the_providers_place_files_under():
    from pyiceberg.table.locations import ObjectStoreLocationProvider

    assert isinstance(inspect.getattr_static(ObjectStoreLocationProvider, "_compute_hash"), staticmethod)
    provider = ObjectStoreLocationProvider("s3://b/t", {})
    assert provider.new_data_location("ts_day=2026-01-02/f.parquet") == \
        f"s3://b/t/data/{object_store_hash('ts_day=2026-01-02/f.parquet')}/ts_day=2026-01-02/f.parquet"
    assert object_store_hash("a") != object_store_hash("b")
