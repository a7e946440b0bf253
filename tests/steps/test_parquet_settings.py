"""The table's Parquet write properties in the engine's own files, read back with pyarrow: the compression level,
the dictionary size, bloom filters within their byte cap, the scan sizing units in the table's codec, and a
misspelt value stopping the job before it writes a file. (Pages, codecs and row groups against Iceberg Java's
writer: `tests/lake/test_parquet_settings.py`.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import timelake
from tests.conftest import SCHEMA, make_readings, recent
from timelake.model.parquet_settings import ParquetSettings
from timelake.adapters.objects import ArrowObjects
from timelake.steps.write import write_parquet


def table_with(lake: timelake.Lake, name: str, target_file_size: str = "64MB", **properties: str) -> timelake.Table:
    table = lake.create_table(name, schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                              retention="P3Y", target_file_size=target_file_size)
    with table.iceberg.transaction() as tx:
        tx.set_properties(properties)
    return table


def files_of(table: timelake.Table) -> list[pq.ParquetFile]:
    return [pq.ParquetFile(task.file.file_path.removeprefix("file://"))
            for task in table.iceberg.refresh().scan().plan_files()]


def chunks(files: list[pq.ParquetFile], column: str) -> list[pq.ColumnChunkMetaData]:
    return [f.metadata.row_group(g).column(f.schema_arrow.get_field_index(column))
            for f in files for g in range(f.metadata.num_row_groups)]


def test_the_compression_level_is_the_tables(lake: timelake.Lake) -> None:
    source = make_readings(recent(10), days=2, devices=6, step_minutes=1)
    sizes = {}
    for level in ("1", "19"):
        table = table_with(lake, f"iot.zstd{level}", **{"write.parquet.compression-level": level})
        table.backfill(source=source).wait()
        assert {c.compression for c in chunks(files_of(table), "value")} == {"ZSTD"}
        sizes[level] = sum(task.file.file_size_in_bytes for task in table.iceberg.refresh().scan().plan_files())
    assert sizes["19"] < sizes["1"]


def test_a_level_for_a_codec_without_levels_is_ignored_as_iceberg_does(lake: timelake.Lake) -> None:
    table = table_with(lake, "iot.snappy", **{"write.parquet.compression-codec": "SNAPPY",
                                               "write.parquet.compression-level": "5"})
    table.backfill(source=make_readings(recent(10), days=1)).wait()
    assert {c.compression for c in chunks(files_of(table), "ts")} == {"SNAPPY"}


def test_a_column_whose_values_outgrow_the_tables_dictionary_size_is_written_plain(lake: timelake.Lake) -> None:
    source = make_readings(recent(10), days=2, devices=6, step_minutes=1)
    source = source.set_column(2, "value", pa.array(np.round(source.column("value").to_numpy(), 1)))  # 1,001 values
    encodings = {}
    for name, size in (("wide", None), ("narrow", "4096")):  # 2 MB by default; 512 doubles
        table = table_with(lake, f"iot.{name}", **({"write.parquet.dict-size-bytes": size} if size else {}))
        table.backfill(source=source).wait()
        encodings[name] = {e for c in chunks(files_of(table), "value") for e in c.encodings}
    assert "RLE_DICTIONARY" in encodings["wide"]
    assert "RLE_DICTIONARY" not in encodings["narrow"] and "PLAIN" in encodings["narrow"]


@pytest.mark.parametrize("fpp", [0.001, 0.01, 0.3])
@pytest.mark.parametrize("cap", [32, 1000, 4096, 65_536])
def test_a_bloom_filter_keeps_within_the_tables_byte_cap(tmp_path: Path, cap: int, fpp: float) -> None:
    rows = pa.table({"id": pa.array(np.arange(300_000) * 7919 % 1_000_003), "v": np.arange(300_000.0)})
    settings = ParquetSettings.from_properties({
        "write.parquet.bloom-filter-enabled.column.id": "true", "write.parquet.bloom-filter-fpp.column.id": str(fpp),
        "write.parquet.bloom-filter-max-bytes": str(cap)})
    path = tmp_path / "f.parquet"
    write_parquet(rows, str(path), settings, objects=ArrowObjects())
    meta = pq.ParquetFile(path).metadata.row_group(0)
    header = 64  # the filter's Thrift header, a few bytes
    assert 0 < meta.column(0).bloom_filter_length <= max(cap, 32) + header
    assert meta.column(1).bloom_filter_length is None or meta.column(1).bloom_filter_length <= 0


def test_a_bloom_filter_is_sized_for_the_distinct_values_or_the_tables_count(tmp_path: Path) -> None:
    """A column of a few values gets a small filter, not the byte cap (Iceberg Java's size without a count);
    the table's count of distinct values sizes it when given."""
    rows = pa.table({"site": pa.array(["a", "b", "c"] * 100_000), "id": pa.array(np.arange(300_000))})
    enabled = {"write.parquet.bloom-filter-enabled.column.site": "true", "write.parquet.bloom-filter-enabled.column.id": "true"}
    lengths = {}
    for name, extra in (("own", {}), ("told", {"write.parquet.bloom-filter-ndv.column.id": "1000"})):
        write_parquet(rows, str(tmp_path / f"{name}.parquet"), ParquetSettings.from_properties({**enabled, **extra}),
                      objects=ArrowObjects())
        group = pq.ParquetFile(tmp_path / f"{name}.parquet").metadata.row_group(0)
        lengths[name] = group.column(0).bloom_filter_length, group.column(1).bloom_filter_length
    assert lengths["own"][0] <= 128 and lengths["told"][0] <= 128  # 3 values
    assert lengths["told"][1] <= 4096 < 262_144 <= lengths["own"][1] <= (1 << 20) + 64  # 1,000 told; 300,000 counted


def test_a_bloom_filter_on_a_column_the_table_lacks_is_not_written(lake: timelake.Lake) -> None:
    table = table_with(lake, "iot.dropped", **{"write.parquet.bloom-filter-enabled.column.gone": "true"})
    table.backfill(source=make_readings(recent(10), days=1)).wait()
    assert all((c.bloom_filter_length or 0) <= 0 for n in SCHEMA.names for c in chunks(files_of(table), n))


def test_the_scan_sizes_units_in_the_tables_codec(lake: timelake.Lake) -> None:
    """Units are sized on a sample written as the files will be: uncompressed files come out near the target,
    not the several times larger a sample measured compressed would make them."""
    target = 64 * 1024
    table = table_with(lake, "iot.raw", target_file_size=f"{target // 1024}KB",
                       **{"write.parquet.compression-codec": "uncompressed"})
    table.backfill(source=make_readings(recent(10), days=1, devices=16, step_minutes=1)).wait()
    sizes = [task.file.file_size_in_bytes for task in table.iceberg.refresh().scan().plan_files()]
    assert len(sizes) > 3 and max(sizes) <= 1.5 * target, sizes


@pytest.mark.parametrize(("key", "value", "said"), [
    ("write.parquet.compression-codec", "lzo", "the Parquet writer takes brotli, gzip, lz4, snappy, uncompressed, zstd"),
    ("write.parquet.compression-level", "99", "zstd takes levels"),
    ("write.parquet.compression-level", "high", "not a whole number"),
    ("write.parquet.page-row-limit", "lots", "not a whole number"),
    ("write.parquet.page-size-bytes", "0", "must be at least 1"),
    ("write.parquet.row-group-size-bytes", "-5", "must be at least 1"),
    ("write.parquet.bloom-filter-enabled.column.device_id", "yes", "true or false"),
    ("write.parquet.bloom-filter-fpp.column.device_id", "1.5", "a probability between 0 and 1"),
    ("write.parquet.bloom-filter-ndv.column.device_id", "many", "not a whole number"),
])
def test_a_bad_parquet_property_stops_the_job_before_it_writes(lake: timelake.Lake, warehouse: Path, key: str, value: str,
                                                               said: str) -> None:
    table = table_with(lake, "iot.bad", **{key: value})
    job = table.backfill(source=make_readings(recent(10), days=1))
    with pytest.raises(ValueError, match=f"table property {key}={value!r}|table property {key}={value}") as caught:
        job.wait()
    assert said in str(caught.value)
    assert job.status()["phase"] == "failed" and job.status()["steps"][0]["name"] == "plan"
    assert table.iceberg.refresh().current_snapshot() is None
    assert not list(warehouse.rglob("*.parquet"))
