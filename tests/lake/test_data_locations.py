"""Data locations Spark set on the table (``write.data.path``, ``write.object-storage.enabled``): the engine's
files land where Iceberg Java puts Spark's, in the same layout (with a data path outside the table's location,
Java adds the table's namespace and name after the hashed directories), and Spark reads exactly the merged rows.
A table Spark upgraded to a format version the engine's commits cannot write is refused before any file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import timelake
from tests.conftest import Readings, recent, reference_merge, sort_rows
from tests.lake.spark import SparkLake, local_path
from timelake.errors import BackfillError
from timelake.model.iceberg_private import object_store_hash

TABLE = "iot.sensor"


def layout(path: str, root: Path) -> str:
    """A data file's place under ``root`` with its hashed directories and its name blanked out."""
    under = str(local_path(path).relative_to(root))
    return re.sub(r"[^/]+\.parquet$", "FILE", re.sub(r"^[01]{4}/[01]{4}/[01]{4}/[01]{8}/", "HASH/", under))


@pytest.mark.parametrize("hashed", [False, True])
def test_our_files_land_where_and_as_spark_puts_its_own(spark: SparkLake, sensor: timelake.Table, readings: Readings,
                                                        hashed: bool, tmp_path: Path) -> None:
    root = tmp_path / "data-bucket"
    properties = {"write.data.path": f"file:{root}", **({"write.object-storage.enabled": "true"} if hashed else {})}
    pairs = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} SET TBLPROPERTIES ({pairs})")
    existing = readings(recent(10), days=2, devices=3, step_minutes=60, seed=1)
    spark.insert(TABLE, existing)
    source = readings(recent(10), days=2, devices=5, step_minutes=30, seed=2)
    sensor.backfill(source=source, mode="merge").wait()
    assert sort_rows(spark.rows(TABLE)).equals(reference_merge(existing, source))

    files = [r["file_path"] for r in spark.sql(f"SELECT file_path FROM {spark.name(TABLE)}.files")]
    ours = [f for f in files if "/bf-" in f]
    theirs = [f for f in files if f not in ours]
    assert len(ours) == len(theirs) == 2
    assert {layout(f, root) for f in ours} == {layout(f, root) for f in theirs}
    assert all(layout(f, root).startswith("HASH/" if hashed else "ts_day=") for f in files)
    if hashed:  # Java's hash of each of its files' partition path and name is ours too
        for f in theirs:
            under = str(local_path(f).relative_to(root)).split("/")
            assert "/".join(under[:4]) == object_store_hash("/".join(under[-2:]))


def test_a_table_spark_upgraded_to_format_version_3_is_refused_before_a_file_is_written(
        spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    """pyiceberg, which the engine commits with, writes no v3 metadata: a job that planned would write its files
    and then fail at its first commit. It stops at its plan, saying why, and the table stays as Spark left it."""
    existing = readings(recent(10), days=2, devices=3, step_minutes=60, seed=1)
    spark.insert(TABLE, existing)
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} SET TBLPROPERTIES ('format-version' = '3')")
    before = spark.sql(f"SELECT snapshot_id FROM {spark.name(TABLE)}.snapshots")
    job = sensor.backfill(source=readings(recent(10), days=2, devices=5, step_minutes=30, seed=2), mode="merge")
    with pytest.raises(BackfillError, match="is Iceberg format version 3: .* backfill into a v2 table"):
        job.wait()
    assert job.record().phase == "failed" and job.record().state.get("failed_phase") == "planning"
    assert spark.sql(f"SELECT snapshot_id FROM {spark.name(TABLE)}.snapshots") == before
    assert sort_rows(spark.rows(TABLE)).equals(sort_rows(existing))
    assert not list(local_path(sensor.iceberg.location()).rglob("bf-*.parquet"))
