"""Rows Spark deleted with merge-on-read (``write.delete.mode``: position delete files beside the data files, not
rewritten files) are gone for every job: a merge writes the source's rows for keys Spark deleted (they no longer
exist, so nothing wins over them), a replace swaps out a day whose files carry deletes, and Spark reads exactly
the rows expected."""

from __future__ import annotations

import pyarrow.compute as pc

import timelake
from tests.conftest import Readings, after_replace, recent, reference_merge, sort_rows
from tests.lake.spark import SparkLake

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

    source = readings(recent(10), days=3, devices=4, step_minutes=30, seed=2)
    merged = sensor.backfill(source=source, mode="merge").wait()
    expected = reference_merge(left, source)
    assert sort_rows(spark.rows(TABLE)).equals(expected)
    assert merged.report()["rows_conflicting_existing"] == left.num_rows

    start, end = recent(9), recent(8)
    fresh = readings(start, days=1, devices=2, step_minutes=20, seed=3)
    sensor.backfill(source=fresh, mode="replace", start=start, end=end).wait()
    assert sort_rows(spark.rows(TABLE)).equals(after_replace(expected, fresh, start, end))
