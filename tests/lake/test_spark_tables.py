"""A table Spark created (Spark's types, nullable columns, no sort order, ``days(ts)``) takes backfills once its
contract is set as table properties in the same ``CREATE TABLE``: the merge and the replace publish exactly the
rows Spark then reads. One whose time column has no zone is refused at plan, and a contract column Spark renamed
is named with the properties that still hold its old name; a value column Spark widened reads in its new type."""

from __future__ import annotations

import pyarrow as pa
import pytest

import timelake
from tests.conftest import Readings, recent, reference_merge, sort_rows
from tests.lake.scenarios import merge_then_replace
from tests.lake.spark import SparkLake
from timelake.errors import BackfillError

TABLE = "iot.sensor"


def test_a_table_spark_created_with_the_contract_as_properties_is_backfilled(spark: SparkLake, lake: timelake.Lake,
                                                                             readings: Readings) -> None:
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {spark.catalog_name}.iot")
    spark.sql(f"CREATE TABLE {spark.name('iot.made')} (ts timestamp, device_id string, value double) USING iceberg "
              "PARTITIONED BY (days(ts)) TBLPROPERTIES ('timelake.time-column' = 'ts', 'timelake.series-key' = 'device_id')")
    existing = readings(recent(10), days=3, devices=3, step_minutes=60, seed=1)
    spark.insert("iot.made", existing)
    table = lake.table("iot.made")
    assert table.contract.series_key == ("device_id",) and not table.iceberg.sort_order().fields
    merge_then_replace(spark, table, readings, existing, devices=4, table="iot.made")


def test_a_spark_table_whose_time_column_has_no_zone_is_refused_naming_it(spark: SparkLake, lake: timelake.Lake,
                                                                          readings: Readings) -> None:
    """Spark's ``timestamp_ntz`` is Iceberg's ``timestamp`` without zone: the engine's times are UTC instants,
    so a job stops at its plan, naming the column and both types, and writes nothing."""
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {spark.catalog_name}.iot")
    spark.sql(f"CREATE TABLE {spark.name('iot.ntz')} (ts timestamp_ntz, device_id string, value double) USING iceberg "
              "PARTITIONED BY (days(ts)) TBLPROPERTIES ('timelake.time-column' = 'ts', 'timelake.series-key' = 'device_id')")
    job = lake.table("iot.ntz").backfill(source=readings(recent(10), days=1, devices=2))
    with pytest.raises(BackfillError, match=r"time column 'ts' is timestamp\[us\], expected timestamp\[us, tz=UTC\]"):
        job.wait()
    assert job.record().state.get("failed_phase") == "planning"
    assert spark.sql(f"SELECT count(*) AS n FROM {spark.name('iot.ntz')}") == [{"n": 0}]


def test_a_time_column_spark_renamed_is_named_with_the_properties_to_set(spark: SparkLake, sensor: timelake.Table,
                                                                         readings: Readings) -> None:
    """Spark renames the time column; the contract's properties still name the old one. A job stops at its plan
    naming both properties that do; once they name the new column, the job publishes and Spark reads its rows."""
    existing = readings(recent(10), days=1, devices=2, seed=1)
    spark.insert(TABLE, existing)
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} RENAME COLUMN ts TO event_time")
    source = readings(recent(10), days=1, devices=3, step_minutes=30, seed=2)
    job = sensor.backfill(source=source)
    with pytest.raises(ValueError, match=r"'timelake.time-column' names 'ts'; 'timelake.dedup-key' names 'ts', which "
                                            r"the table's schema does not have"):
        job.wait()
    assert job.record().state.get("failed_phase") == "planning"
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} SET TBLPROPERTIES ('timelake.time-column' = 'event_time', "
              "'timelake.dedup-key' = 'device_id,event_time')")
    sensor.refresh().backfill(source=source, map={"event_time": "ts"}).wait()
    rows = spark.rows(TABLE).rename_columns(["ts", "device_id", "value"])
    assert sort_rows(rows).equals(reference_merge(existing, source))


def test_a_value_column_spark_widened_reads_old_files_in_the_new_type(spark: SparkLake, lake: timelake.Lake,
                                                                      readings: Readings) -> None:
    """Spark promotes ``value`` from float to double (a metadata change: its files keep floats): merge, replace
    and a merge with a diff read main's old files in the new type, and Spark reads exactly the rows expected."""
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {spark.catalog_name}.iot")
    spark.sql(f"CREATE TABLE {spark.name('iot.widened')} (ts timestamp, device_id string, value float) USING iceberg "
              "PARTITIONED BY (days(ts)) TBLPROPERTIES ('timelake.time-column' = 'ts', 'timelake.series-key' = 'device_id')")
    existing = readings(recent(10), days=3, devices=3, step_minutes=60, seed=1)
    floats = existing.column("value").cast(pa.float32())
    spark.insert("iot.widened", existing.set_column(2, "value", floats))
    spark.sql(f"ALTER TABLE {spark.name('iot.widened')} ALTER COLUMN value TYPE double")
    table = lake.table("iot.widened")
    held = existing.set_column(2, "value", floats.cast(pa.float64()))
    merge_then_replace(spark, table, readings, held, devices=4, table="iot.widened")
    job = table.backfill(source=readings(recent(10), days=1, devices=2, seed=9), mode="merge", diff=True).wait()
    assert job.record().phase == "published" and job.diff()["totals"]["in_both"] > 0
