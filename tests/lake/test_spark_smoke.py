"""The Spark harness on tables the engine wrote: each operation another engine runs on a shared lake
does what Iceberg says it does, and Spark and pyiceberg read the same rows afterwards.

The references are computed independently: the rows the test fed in (and Spark inserted), the files
on disk, the snapshots in the metadata.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import timelake
from tests.conftest import Readings, recent, sort_rows
from tests.lake.spark import SparkLake, local_path, missing_files, referenced_files

TABLE = "iot.sensor"


def pyiceberg_rows(spark: SparkLake, ref: str | None = None) -> pa.Table:
    scan = spark.pyiceberg_table(TABLE).scan()
    return (scan.use_ref(ref) if ref else scan).to_arrow()


def assert_both_read(spark: SparkLake, expected: pa.Table) -> None:
    """Spark and pyiceberg each read exactly ``expected`` from main, and no referenced file is missing."""
    want = sort_rows(expected).to_pylist()
    assert sort_rows(spark.rows(TABLE)).to_pylist() == want
    assert sort_rows(pyiceberg_rows(spark)).to_pylist() == want
    assert missing_files(spark.pyiceberg_table(TABLE)) == []


def live_files(spark: SparkLake) -> set[str]:
    table = spark.pyiceberg_table(TABLE)
    return {str(local_path(task.file.file_path)) for task in table.scan().plan_files()}


def catalog_writable(warehouse: Path) -> bool:
    """Whether another process can commit to the catalog file right now (no waiting)."""
    con = sqlite3.connect(warehouse / "catalog.db", timeout=0, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("UPDATE iceberg_tables SET table_name = table_name")
        con.execute("COMMIT")
        return True
    except sqlite3.OperationalError as exc:
        assert "database is locked" in str(exc)
        return False
    finally:
        con.close()


def test_spark_reads_what_the_engine_wrote(spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    source = readings(recent(10), days=3)
    sensor.backfill(source=source).wait()
    assert_both_read(spark, source)
    current = spark.pyiceberg_table(TABLE).current_snapshot().snapshot_id
    assert spark.sql(f"SELECT snapshot_id FROM {spark.name(TABLE)}.snapshots WHERE snapshot_id = {current}")


def test_insert_by_spark_is_read_by_pyiceberg(spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    source, inserted = readings(recent(10), days=2), readings(recent(4), days=1, devices=2, seed=7)
    sensor.backfill(source=source).wait()
    before = live_files(spark)
    spark.insert(TABLE, inserted)
    assert_both_read(spark, pa.concat_tables([source, inserted]))
    table = spark.pyiceberg_table(TABLE)
    assert table.current_snapshot().summary.operation.value == "append"
    java_paths = [t.file.file_path for t in table.scan().plan_files() if str(local_path(t.file.file_path)) not in before]
    assert java_paths and all(p.startswith("file:/") and not p.startswith("file://") for p in java_paths)


def test_rewrite_data_files_commits_a_replace(spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    first, second = readings(recent(10), days=3, devices=2), readings(recent(10), days=3, devices=4, seed=3)
    second = second.filter(pa.compute.is_in(second["device_id"], pa.array(["d02", "d03"])))
    sensor.backfill(source=first).wait()
    sensor.backfill(source=second).wait()
    before = live_files(spark)
    assert len(before) == 6  # two files in each of three day partitions
    result = spark.rewrite_data_files(TABLE, **{"min-input-files": "2"})
    assert (result["rewritten_data_files_count"], result["added_data_files_count"]) == (6, 3)
    table = spark.pyiceberg_table(TABLE)
    assert table.current_snapshot().summary.operation.value == "replace"
    after = live_files(spark)
    assert len(after) == 3 and not after & before
    assert all(Path(path).exists() for path in before)  # replaced, not yet deleted: older snapshots hold them
    assert_both_read(spark, pa.concat_tables([first, second]))


def test_expire_snapshots_drops_snapshots_and_deletes_their_files(
        spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    old, new = readings(recent(10), days=2), readings(recent(10), days=2, value_offset=1000)
    sensor.backfill(source=old).wait()
    replaced = live_files(spark)
    sensor.backfill(source=new, mode="replace").wait()
    assert len(spark.pyiceberg_table(TABLE).snapshots()) >= 2
    assert all(Path(path).exists() for path in replaced)
    result = spark.expire_snapshots(TABLE, retain_last=1)
    table = spark.pyiceberg_table(TABLE)
    assert [s.snapshot_id for s in table.snapshots()] == [table.current_snapshot().snapshot_id]
    assert result["deleted_data_files_count"] == len(replaced)
    assert not any(Path(path).exists() for path in replaced)
    assert_both_read(spark, new)


def test_rewrite_manifests_merges_them(spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    source, inserted = readings(recent(10), days=2), readings(recent(4), days=1, seed=5)
    sensor.backfill(source=source).wait()
    spark.insert(TABLE, inserted)
    table = spark.pyiceberg_table(TABLE)
    manifests = table.current_snapshot().manifests(table.io)
    assert len(manifests) >= 2
    result = spark.rewrite_manifests(TABLE)
    assert result["rewritten_manifests_count"] == len(manifests)
    table = spark.pyiceberg_table(TABLE)
    assert table.current_snapshot().summary.operation.value == "replace"
    assert len(table.current_snapshot().manifests(table.io)) == result["added_manifests_count"] < len(manifests)
    assert_both_read(spark, pa.concat_tables([source, inserted]))


def test_orphan_removal_deletes_only_what_no_snapshot_references(
        spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    source = readings(recent(10), days=2)
    sensor.backfill(source=source).wait()
    table = spark.pyiceberg_table(TABLE)
    orphan = local_path(table.location()) / "data" / "ts_day=2000-01-01" / "written-by-nobody.parquet"
    orphan.parent.mkdir(parents=True)
    pq.write_table(readings("2000-01-01", days=1), orphan)
    referenced = set(referenced_files(table))
    metadata = {str(local_path(s.manifest_list)) for s in table.snapshots()} | {
        str(local_path(m.manifest_path)) for s in table.snapshots() for m in s.manifests(table.io)}
    deleted = {str(local_path(path)) for path in spark.remove_orphan_files(TABLE)}
    # Besides ours, Java finds the manifest and manifest list of the job's staged snapshot, which the
    # engine drops from the metadata at publish (its files went to main in a new snapshot).
    assert {path for path in deleted if "/data/" in path} == {str(orphan)}
    assert not deleted & (referenced | metadata)
    assert not any(Path(path).exists() for path in deleted)
    assert all(Path(path).exists() for path in referenced | metadata)
    assert_both_read(spark, source)


def test_added_column_is_visible_to_pyiceberg(spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    source, inserted = readings(recent(10), days=1), readings(recent(4), days=1, devices=1, seed=9)
    sensor.backfill(source=source).wait()
    spark.add_column(TABLE, "site", "string")
    field = spark.pyiceberg_table(TABLE).schema().find_field("site")
    assert (str(field.field_type), field.required) == ("string", False)
    spark.insert(TABLE, inserted.append_column("site", pa.array(["north"] * inserted.num_rows)))
    sites = {(row["device_id"], row["ts"]): row["site"] for row in pyiceberg_rows(spark).to_pylist()}
    expected = {**{(r["device_id"], r["ts"]): None for r in source.to_pylist()},
                **{(r["device_id"], r["ts"]): "north" for r in inserted.to_pylist()}}
    assert sites == expected
    assert {(row["device_id"], row["ts"]): row["site"] for row in spark.rows(TABLE).to_pylist()} == expected


def test_added_partition_field_is_used_by_both(spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    source, inserted = readings(recent(10), days=1), readings(recent(4), days=1, seed=11)
    sensor.backfill(source=source).wait()
    spark.add_partition_field(TABLE, "bucket(4, device_id)")
    table = spark.pyiceberg_table(TABLE)
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("ts_day", "day"),
                                                                        ("device_id_bucket_4", "bucket[4]")]
    spark.insert(TABLE, inserted)
    table = spark.pyiceberg_table(TABLE)
    specs = {str(local_path(t.file.file_path)): t.file.spec_id for t in table.scan().plan_files()}
    assert set(specs.values()) == {0, table.spec().spec_id}
    assert_both_read(spark, pa.concat_tables([source, inserted]))


def test_catalog_file_is_locked_only_while_spark_holds_the_catalog(
        spark: SparkLake, sensor: timelake.Table, readings: Readings, warehouse: Path) -> None:
    first, second = readings(recent(10), days=1), readings(recent(9), days=1)
    sensor.backfill(source=first).wait()
    assert spark.rows(TABLE).num_rows == first.num_rows
    assert catalog_writable(warehouse)
    with spark.held():
        assert spark.rows(TABLE).num_rows == first.num_rows
        assert not catalog_writable(warehouse)
    assert catalog_writable(warehouse)
    sensor.backfill(source=second).wait()
    assert_both_read(spark, pa.concat_tables([first, second]))


def test_maintenance_keeps_a_staged_branch_and_its_files(
        spark: SparkLake, lake: timelake.Lake, sensor: timelake.Table, readings: Readings) -> None:
    from tests.conftest import stage_job

    main_rows, staged_rows = readings(recent(20), days=2), readings(recent(10), days=2)
    sensor.backfill(source=main_rows).wait()
    branch = f"backfill/{stage_job(lake, staged_rows)}"
    head = spark.pyiceberg_table(TABLE).metadata.refs[branch].snapshot_id
    spark.rewrite_data_files(TABLE, **{"rewrite-all": "true"})
    spark.rewrite_manifests(TABLE)
    result = spark.expire_snapshots(TABLE, retain_last=1)
    spark.remove_orphan_files(TABLE)
    table = spark.pyiceberg_table(TABLE)
    assert table.metadata.refs[branch].snapshot_id == head
    assert result["deleted_data_files_count"] == 0  # main's compacted-away files are still the branch's
    assert missing_files(table) == []
    both = sort_rows(pa.concat_tables([main_rows, staged_rows])).to_pylist()
    assert sort_rows(spark.rows(TABLE, ref=branch)).to_pylist() == both
    assert sort_rows(pyiceberg_rows(spark, ref=branch)).to_pylist() == both
    assert_both_read(spark, main_rows)


@pytest.mark.parametrize("location", ["file:/tmp/x/a.parquet", "file:///tmp/x/a.parquet", "/tmp/x/a.parquet"])
def test_local_path_reads_every_local_form(location: str) -> None:
    assert local_path(location) == Path("/tmp/x/a.parquet")
