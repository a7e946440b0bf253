"""The table's Parquet write properties, set through Spark, shape the files the engine writes as they shape
Spark's own: codec, page rows, row groups (in rows and in bytes) and bloom filters, read back page by page with
parquet-mr, the Parquet library Iceberg Java writes and reads with; both carry a page index. Spark then reads
every row back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import timelake
from tests.conftest import Readings, recent, sort_rows
from tests.lake.spark import RowGroup, SparkLake, local_path, parquet_row_groups

TABLE = "iot.sensor"
ABSENT = {"device_id": [f"zz-{i:03d}" for i in range(200)], "value": [-1.0 - i for i in range(200)]}
BLOOMS = ("device_id", "value")


def set_properties(spark: SparkLake, **properties: str) -> None:
    pairs = ", ".join(f"'{key}' = '{value}'" for key, value in properties.items())
    spark.sql(f"ALTER TABLE {spark.name(TABLE)} SET TBLPROPERTIES ({pairs})")


def data_files(spark: SparkLake) -> list[str]:
    return [task.file.file_path for task in spark.pyiceberg_table(TABLE).scan().plan_files()]


def by_writer(spark: SparkLake, files: list[str]) -> tuple[list[str], list[str]]:
    """The engine's files (named after their job) and Spark's."""
    ours = [f for f in files if "/bf-" in f or "-bf-" in f]
    return ours, [f for f in files if f not in ours]


def row_groups(spark: SparkLake, location: str) -> tuple[pa.Table, list[RowGroup]]:
    """A file's rows, and its row groups with the values of the bloom filtered columns probed (its own and absent ones)."""
    rows = pq.read_table(local_path(location))
    probe = {c: sorted(set(rows.column(c).to_pylist())) + ABSENT[c] for c in BLOOMS}
    return rows, parquet_row_groups(spark.session, location, probe)


def outside(rows: pa.Table, lo: datetime, hi: datetime) -> pa.Table:
    ts, kind = rows.column("ts"), rows.schema.field("ts").type
    return rows.filter(pc.or_(pc.less(ts, pa.scalar(lo, kind)), pc.greater_equal(ts, pa.scalar(hi, kind))))


def test_codec_pages_row_groups_and_bloom_filters_follow_the_properties_spark_set(
        spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    set_properties(spark, **{
        "write.parquet.compression-codec": "gzip", "write.parquet.page-row-limit": "700",
        "write.parquet.row-group-limit": "3000", "write.parquet.bloom-filter-enabled.column.device_id": "true",
        "write.parquet.bloom-filter-fpp.column.device_id": "0.02", "write.parquet.bloom-filter-max-bytes": "4096",
        "write.parquet.bloom-filter-enabled.column.value": "true", "write.parquet.dict-size-bytes": "1024"})
    first, merged = readings(recent(10), days=2, devices=5, step_minutes=1), readings(recent(11), days=2, devices=6,
                                                                                       step_minutes=1, seed=3)
    sensor.backfill(source=first).wait()  # into an empty table: the scan writes the files
    sensor.backfill(source=merged, mode="merge").wait()  # existing rows win: the files hold the new keys alone
    noon = datetime.fromisoformat(recent(10)).replace(tzinfo=UTC) + timedelta(hours=12)
    replaced = readings(recent(10), days=0.5, devices=2, step_minutes=1, seed=5)
    sensor.backfill(source=replaced, mode="replace", start=recent(10), end=noon).wait()  # the day's rest is rewritten
    inserted = readings(recent(20), days=1, devices=3, step_minutes=1, seed=9)
    spark.insert(TABLE, inserted)

    ours, sparks = by_writer(spark, data_files(spark))
    assert len(ours) >= 4 and sparks
    assert any("-rest-" in f for f in ours)  # publish's rewrite of a file the replaced range cuts
    java_blooms = 0
    for location in ours + sparks:
        rows, groups = row_groups(spark, location)
        for g, group in enumerate(groups):
            start = sum(r.rows for r in groups[:g])
            for name, chunk in group.columns.items():
                assert chunk.codec == "GZIP", (location, name)
                assert max(chunk.page_values) <= 700 and sum(chunk.page_values) == group.rows, (location, name)
                assert chunk.indexed_pages == len(chunk.page_values), (location, name)  # both write a page index
                if name not in BLOOMS or (location in sparks and chunk.dictionary_only):  # Java: the dictionary filters
                    assert chunk.bloom_bytes is None, (location, name)
                    continue
                java_blooms += location in sparks
                assert chunk.bloom_bytes is not None and chunk.bloom_bytes <= 4096, (location, name)
                present = set(rows.column(name).slice(start, group.rows).to_pylist())
                assert all(chunk.bloom_holds[v] for v in present), (location, name)  # a bloom filter never misses
                assert sum(chunk.bloom_holds[v] for v in ABSENT[name]) <= 20, (location, name)  # about 1-2 % of 200
        if location in ours:  # the row limit is pyiceberg's property; Iceberg Java sizes groups in bytes alone
            assert all(group.rows <= 3000 for group in groups) and sum(g.rows for g in groups) == rows.num_rows
    assert java_blooms  # Spark read the same property names: its plain-encoded value column has its filters

    first_keys = set(zip(first.column("device_id").to_pylist(), first.column("ts").to_pylist(), strict=True))
    fresh = merged.filter(pa.array([k not in first_keys for k in zip(
        merged.column("device_id").to_pylist(), merged.column("ts").to_pylist(), strict=True)]))
    expected = pa.concat_tables([outside(first, noon - timedelta(hours=12), noon), outside(fresh, noon - timedelta(hours=12), noon),
                                 replaced, inserted])
    assert sort_rows(spark.rows(TABLE)).to_pylist() == sort_rows(expected).to_pylist()
    assert spark.sql(f"SELECT count(*) AS n FROM {spark.name(TABLE)} WHERE device_id = 'zz-001'") == [{"n": 0}]


def test_row_groups_keep_within_the_tables_row_group_bytes_as_sparks_do(
        spark: SparkLake, sensor: timelake.Table, readings: Readings) -> None:
    """Java checks a row group's buffered bytes: its flushed pages compressed, the page being filled raw. With
    small pages (as in any row group of the default 128 MB) that is the compressed size the engine counts."""
    limit = 16_384
    set_properties(spark, **{"write.parquet.row-group-size-bytes": str(limit), "write.parquet.page-row-limit": "200"})
    source = readings(recent(10), days=1, devices=8, step_minutes=1)
    sensor.backfill(source=source).wait()
    spark.insert(TABLE, readings(recent(20), days=1, devices=8, step_minutes=1))
    ours, sparks = by_writer(spark, data_files(spark))
    mine = [g for f in ours for g in parquet_row_groups(spark.session, f)]
    theirs = [g for f in sparks for g in parquet_row_groups(spark.session, f)]
    assert sum(g.rows for g in mine) == source.num_rows
    assert len(mine) >= 3 and all(g.compressed_bytes <= 1.1 * limit for g in mine)
    assert all(g.compressed_bytes >= 0.8 * limit for g in mine[1:-1])  # the first is sized on the rows in memory
    middle = sorted(g.rows for g in mine[1:-1])[len(mine[1:-1]) // 2]
    assert 0.8 <= middle / sorted(g.rows for g in theirs)[len(theirs) // 2] <= 1.25, (mine, theirs)
