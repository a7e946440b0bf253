"""A table whose metrics modes Spark set to keep statistics out of its manifests (``write.metadata.metrics.*``, as wide
tables often have them) takes a merge and a replace over Spark's own files. Iceberg Java's ``files`` table lists
the same statistics for every file, Spark's and ours (its sort columns keep bounds under ``counts`` or ``none``, a
column's own mode wins), validation reads what the entries lack from the files, and Spark reads exactly the rows
expected."""

from __future__ import annotations

import pytest

import timelake
from tests.conftest import Readings, recent
from tests.lake.scenarios import merge_then_replace
from tests.lake.spark import SparkLake

TABLE = "iot.sensor"
PROPERTIES = {
    "sorted-promoted": {"write.metadata.metrics.default": "none", "write.metadata.metrics.column.device_id": "counts"},
    "no-time-bounds": {"write.metadata.metrics.default": "counts", "write.metadata.metrics.column.ts": "none"},
}


def statistics(spark: SparkLake) -> dict[str, tuple[frozenset[int], ...]]:
    """Each file's columns with bounds, null counts and value counts, as Iceberg Java lists them."""
    rows = spark.sql(f"SELECT file_path, lower_bounds, upper_bounds, null_value_counts, value_counts "
                     f"FROM {spark.name(TABLE)}.files")
    return {r["file_path"]: tuple(frozenset(r[k] or {}) for k in ("lower_bounds", "upper_bounds", "null_value_counts",
                                                                  "value_counts")) for r in rows}


@pytest.mark.parametrize("properties", PROPERTIES)
def test_merge_and_replace_over_spark_files_keep_the_statistics_spark_keeps(
        spark: SparkLake, sensor: timelake.Table, readings: Readings, properties: str) -> None:
    pairs = ", ".join(f"'{k}' = '{v}'" for k, v in PROPERTIES[properties].items())
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} SET TBLPROPERTIES ({pairs})")
    existing = readings(recent(10), days=3, devices=3, step_minutes=60, seed=1)
    spark.insert(TABLE, existing)
    merge_then_replace(spark, sensor, readings, existing, devices=5)

    listed = statistics(spark)
    ours = {path: kept for path, kept in listed.items() if "/bf-" in path}
    theirs = {kept for path, kept in listed.items() if path not in ours}
    assert ours and len(ours) < len(listed)  # Spark's files of the days outside the range stay
    assert set(ours.values()) == theirs and len(theirs) == 1  # one set of statistics, whoever wrote the file
    bounded, _, counted, _ = next(iter(theirs))
    assert (bounded, counted) == {"sorted-promoted": ({1}, {1, 2}), "no-time-bounds": ({2}, {2, 3})}[properties]
