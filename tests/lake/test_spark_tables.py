"""A table Spark created (Spark's types, nullable columns, no sort order, ``days(ts)``) takes backfills once its
contract is set as table properties in the same ``CREATE TABLE``: the merge and the replace publish exactly the
rows Spark then reads."""

from __future__ import annotations

import timelake
from tests.conftest import Readings, recent
from tests.lake.scenarios import merge_then_replace
from tests.lake.spark import SparkLake


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
