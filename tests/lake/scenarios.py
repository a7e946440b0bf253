"""Job sequences the shared-lake tests run over a table Spark prepared."""

from __future__ import annotations

import pyarrow as pa

import timelake
from tests.conftest import Readings, after_replace, recent, reference_merge, sort_rows
from tests.lake.spark import SparkLake

TABLE = "iot.sensor"


def merge_then_replace(spark: SparkLake, sensor: timelake.Table, readings: Readings, held: pa.Table, devices: int,
                       table: str = TABLE) -> None:
    """A merge over the three days from ``recent(10)`` of ``held`` (the rows Spark reads of the table now) with
    ``devices`` devices every 30 minutes, then a replace of its middle day: after each, Spark reads exactly the
    rows expected, the merge counts every held row as existing and the replace passes every check. ``sensor`` is
    the engine's handle on ``table``."""
    source = readings(recent(10), days=3, devices=devices, step_minutes=30, seed=2)
    merged = sensor.backfill(source=source, mode="merge").wait()
    expected = reference_merge(held, source)
    assert sort_rows(spark.rows(table)).equals(expected)
    assert merged.report()["rows_conflicting_existing"] == held.num_rows
    start, end = recent(9), recent(8)
    fresh = readings(start, days=1, devices=2, step_minutes=20, seed=3)
    replaced = sensor.backfill(source=fresh, mode="replace", start=start, end=end).wait()
    assert all(c["passed"] for c in replaced.report()["checks"])
    assert sort_rows(spark.rows(table)).equals(after_replace(expected, fresh, start, end))
