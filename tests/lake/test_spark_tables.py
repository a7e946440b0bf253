"""A table Spark created (Spark's types, nullable columns, no sort order, ``days(ts)``) takes backfills once its
contract is set as table properties in the same ``CREATE TABLE``: the merge and the replace publish exactly the
rows Spark then reads. One whose time column has no zone is refused at plan."""

from __future__ import annotations

import pytest

import timelake
from tests.conftest import Readings, recent
from tests.lake.scenarios import merge_then_replace
from tests.lake.spark import SparkLake
from timelake.errors import BackfillError


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
