"""Data locations Spark set on the table (``write.data.path``, ``write.object-storage.enabled``): the engine's
files land where Iceberg Java puts Spark's, in the same layout (with a data path outside the table's location,
Java adds the table's namespace and name after the hashed directories), and Spark reads exactly the merged rows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import timelake
from tests.conftest import Readings, recent, reference_merge, sort_rows
from tests.lake.spark import SparkLake, local_path
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
