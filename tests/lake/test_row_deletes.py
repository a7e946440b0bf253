"""Rows Spark deleted with merge-on-read (``write.delete.mode``: position delete files beside the data files, not
rewritten files) are gone for every job: a merge writes the source's rows for keys Spark deleted (they no longer
exist, so nothing wins over them), a replace swaps out a day whose files carry deletes, and Spark reads exactly
the rows expected. Equality deletes (a Flink upsert's), which pyiceberg cannot apply, stop a job whose range
they meet before it writes a file, with the compaction that folds them in; elsewhere in the table they are
left alone."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import timelake
from tests.conftest import Readings, recent, reference_merge, sort_rows
from tests.lake.scenarios import merge_then_replace
from tests.lake.spark import SparkLake, local_path
from timelake.errors import BackfillError

TABLE = "iot.sensor"


def test_merge_and_replace_see_the_rows_spark_deleted_as_gone(spark: SparkLake, sensor: timelake.Table,
                                                                readings: Readings) -> None:
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} SET TBLPROPERTIES ('write.delete.mode' = 'merge-on-read', "
              "'write.update.mode' = 'merge-on-read', 'write.merge.mode' = 'merge-on-read')")
    existing = readings(recent(10), days=3, devices=3, step_minutes=60, seed=1)
    spark.insert(TABLE, existing)
    spark.sql(f"DELETE FROM {spark.name(TABLE)} WHERE device_id = 'd01' AND hour(ts) < 12")
    deletes = spark.sql(f"SELECT count(*) AS n FROM {spark.name(TABLE)}.delete_files")[0]["n"]
    assert deletes > 0  # the rows are deleted by position, their data files untouched
    gone = pc.and_(pc.equal(existing.column("device_id"), "d01"), pc.less(pc.hour(existing.column("ts")), 12))
    left = existing.filter(pc.invert(gone))
    assert sort_rows(spark.rows(TABLE)).equals(sort_rows(left))

    merge_then_replace(spark, sensor, readings, left, devices=4)


def equality_delete(spark: SparkLake, rows: pa.Table, folder: Path) -> None:
    """Commit an equality delete file on (ts, device_id) of ``rows`` (one day's) through Iceberg Java's API, as a
    Flink upsert does: Spark SQL writes position deletes only."""
    path = folder / "equality-deletes.parquet"
    schema = pa.schema([pa.field("ts", rows.schema.field("ts").type, nullable=False, metadata={b"PARQUET:field_id": b"1"}),
                        pa.field("device_id", pa.string(), nullable=False, metadata={b"PARQUET:field_id": b"2"})])
    pq.write_table(rows.select(["ts", "device_id"]).cast(schema), path)
    jvm, gateway = spark.session._jvm, spark.session.sparkContext._gateway
    with spark.held():
        table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark.session._jsparkSession, spark.name(TABLE))
        ids = gateway.new_array(gateway.jvm.int, 2)
        ids[0], ids[1] = 1, 2
        day = rows.column("ts")[0].as_py().date().isoformat()
        deletes = (jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(table.spec()).ofEqualityDeletes(ids)
                   .withPath(f"file:{path}").withFormat(jvm.org.apache.iceberg.FileFormat.PARQUET)
                   .withFileSizeInBytes(path.stat().st_size).withRecordCount(rows.num_rows)
                   .withPartitionPath(f"ts_day={day}").build())
        table.newRowDelta().addDeletes(deletes).commit()


def test_equality_deletes_in_range_stop_a_job_before_it_writes_until_they_are_folded_in(
        spark: SparkLake, sensor: timelake.Table, readings: Readings, tmp_path: Path) -> None:
    existing = readings(recent(10), days=2, devices=3, step_minutes=60, seed=1)
    spark.insert(TABLE, existing)
    first_day = existing.filter(pc.less(existing.column("ts"), existing.column("ts")[0].as_py() + timedelta(days=1)))
    gone = first_day.filter(pc.equal(first_day.column("device_id"), "d01"))
    equality_delete(spark, gone, tmp_path)
    left = existing.filter(pc.invert(pc.and_(pc.equal(existing.column("device_id"), "d01"),
                                             pc.is_in(existing.column("ts"), gone.column("ts")))))
    assert sort_rows(spark.rows(TABLE)).equals(sort_rows(left))  # Java applies them
    snapshots = spark.sql(f"SELECT snapshot_id FROM {spark.name(TABLE)}.snapshots")

    source = readings(recent(10), days=2, devices=4, step_minutes=30, seed=2)
    job = sensor.backfill(source=source, mode="merge")
    with pytest.raises(BackfillError, match=r"1 equality delete file\(s\) over .*system.rewrite_data_files"):
        job.wait()
    assert spark.sql(f"SELECT snapshot_id FROM {spark.name(TABLE)}.snapshots") == snapshots
    assert not list(local_path(sensor.iceberg.location()).rglob("bf-*.parquet"))

    spark.rewrite_data_files(TABLE, **{"delete-file-threshold": "1", "remove-dangling-deletes": "true"})
    sensor.backfill(source=source, mode="merge").wait()
    assert sort_rows(spark.rows(TABLE)).equals(reference_merge(left, source))


def test_equality_deletes_outside_the_range_leave_a_job_alone(spark: SparkLake, sensor: timelake.Table,
                                                              readings: Readings, tmp_path: Path) -> None:
    existing = readings(recent(10), days=1, devices=3, step_minutes=60, seed=1)
    spark.insert(TABLE, existing)
    gone = existing.filter(pc.equal(existing.column("device_id"), "d02"))
    equality_delete(spark, gone, tmp_path)
    later = readings(recent(5), days=2, devices=3, step_minutes=30, seed=2)
    sensor.backfill(source=later, mode="merge").wait()
    left = existing.filter(pc.not_equal(existing.column("device_id"), "d02"))
    assert sort_rows(spark.rows(TABLE)).equals(sort_rows(pa.concat_tables([left, later])))
