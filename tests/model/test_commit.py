"""The swap that follow-up tables are written with, and what counts as a commit conflict (the private
pyiceberg API the commits build on has its contracts in test_iceberg_private.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import BucketTransform, DayTransform, HourTransform, MonthTransform, YearTransform
from pyiceberg.types import TimestamptzType

import timelake
from timelake.model.commit import is_conflict, swap
from timelake.model.layout import fresh_schema


def test_sequence_number_race_counts_as_conflict():
    assert is_conflict(ValueError("Cannot add snapshot with sequence number 5 older than last sequence number 5"))
    assert not is_conflict(ValueError("something else"))


def _stamps(*iso: str) -> pa.Array:
    return pa.array([datetime.fromisoformat(s) for s in iso], pa.timestamp("us", tz="UTC"))


@pytest.mark.parametrize("transform", [HourTransform(), DayTransform(), MonthTransform(), YearTransform()])
def test_swap_partitions_like_iceberg_and_rewrites_only_the_matching_rows(lake: timelake.Lake, transform: Any) -> None:
    """`swap` partitions rows itself (pyiceberg would need pyiceberg-core, which Lambda does not get):
    every file's partition value is the one Iceberg's own transform gives each of its rows, across the
    epoch and month and year ends; a file where only some rows match the filter keeps the others."""
    lake.catalog.create_namespace("t")
    schema = pa.schema([pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False), pa.field("v", pa.int64())])
    iceberg = fresh_schema(schema)
    table = lake.catalog.create_table("t.x", schema=iceberg, partition_spec=PartitionSpec(
        PartitionField(iceberg.find_field("ts").field_id, 1000, transform, "part")))
    first = pa.table({"ts": _stamps("1969-12-31T22:59:59.999999+00:00", "1969-12-31T23:30:00+00:00",
                                    "1970-01-01T00:00:00+00:00", "2023-12-31T23:59:59+00:00", "2024-01-01T00:00:00+00:00",
                                    "2024-01-01T06:00:00+00:00", "2024-02-29T12:00:00+00:00"),
                      "v": pa.array(range(7), pa.int64())}, schema=schema)
    swap(table, None, first, "first")
    clear = And(GreaterThanOrEqual("ts", "2024-01-01T00:00:00+00:00"), LessThan("ts", "2024-01-01T03:00:00+00:00"))
    second = pa.table({"ts": _stamps("2024-01-01T01:00:00+00:00", "1969-12-31T23:59:59+00:00"),
                       "v": pa.array([100, 101], pa.int64())}, schema=schema)
    swap(table.refresh(), clear, second, "second")

    table = table.refresh()
    got = table.scan().to_arrow().sort_by([("ts", "ascending"), ("v", "ascending")])
    expected = pa.concat_tables([first.filter(pc.invert(pc.field("v") == 4)), second]).sort_by([("ts", "ascending"), ("v", "ascending")])
    assert got.to_pylist() == expected.to_pylist()
    of_row = transform.transform(TimestamptzType())
    files = list(table.scan().plan_files())
    assert len({f.file.partition[0] for f in files}) > 1
    for task in files:
        micros = pc.cast(pq.read_table(task.file.file_path).column("ts"), pa.int64()).to_pylist()
        assert {of_row(us) for us in micros} == {task.file.partition[0]}, task.file.file_path


def test_swap_refuses_a_partition_it_cannot_compute(lake: timelake.Lake) -> None:
    lake.catalog.create_namespace("t")
    schema = pa.schema([pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False), pa.field("v", pa.int64())])
    iceberg = fresh_schema(schema)
    table = lake.catalog.create_table("t.b", schema=iceberg, partition_spec=PartitionSpec(
        PartitionField(iceberg.find_field("v").field_id, 1000, BucketTransform(4), "v_bucket")))
    rows = pa.table({"ts": _stamps("2024-01-01T00:00:00+00:00"), "v": pa.array([1], pa.int64())}, schema=schema)
    with pytest.raises(ValueError, match=r"cannot write rows partitioned by bucket\[4\]\(v\)"):
        swap(table, None, rows, "bucketed")
    assert table.refresh().current_snapshot() is None
