"""A table whose metrics modes keep column statistics out of its manifests (``write.metadata.metrics.*``: ``counts``
on a wide table, ``none`` on a column). The engine's files follow the modes as Iceberg Java's writers read them
(the sort order's columns keep bounds under ``counts`` or ``none``, a column's own mode wins, a wide table keeps
metrics for its first columns), and what needs a file's time bounds or null counts where the entries lack them
(validation, a new rollup's first build, the rules' look-back) reads them from the file's own footer. (Against
Spark's files under the same properties: `tests/lake/test_metrics_modes.py`.)"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import timelake
from tests.conftest import SCHEMA, after_replace, recent, reference_merge, sort_rows, stage_job
from timelake.errors import ValidationFailed
from timelake.model.commit import metrics_modes
from timelake.model.layout import time_bounds, micros
from timelake.steps.validate import validate

METRICS = {"counts": {"write.metadata.metrics.default": "counts"},
           "none": {"write.metadata.metrics.default": "none"},
           "time-none": {"write.metadata.metrics.column.ts": "none"},
           "all-none": {"write.metadata.metrics.default": "none", "write.metadata.metrics.column.ts": "none",
                        "write.metadata.metrics.column.device_id": "none"}}


def metered(lake: timelake.Lake, metrics: dict[str, str], name: str = "iot.sensor") -> timelake.Table:
    table = lake.create_table(name, schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                              retention="P3Y", target_file_size="64MB")
    with table.iceberg.transaction() as tx:
        tx.set_properties(metrics)
    return table.refresh()


def entries(table: timelake.Table) -> list:
    return [task.file for task in table.iceberg.refresh().scan().plan_files()]


def ids(table: timelake.Table) -> dict[str, int]:
    return {f.name: f.field_id for f in table.iceberg.schema().fields}


@pytest.mark.parametrize("mode", METRICS)
def test_backfill_merge_and_replace_publish_and_the_files_keep_the_tables_metrics(lake, readings, mode):
    table = metered(lake, METRICS[mode])
    first = readings(recent(10), days=3, devices=3, step_minutes=30, seed=1)
    table.backfill(source=first).wait()
    more = readings(recent(10), days=3, devices=5, step_minutes=30, seed=2)  # two new devices; the rest exist
    table.backfill(source=more, mode="merge").wait()
    merged = reference_merge(first, more)
    assert sort_rows(table.to_arrow()).equals(merged)

    start, end = recent(9), recent(8)  # the middle day, over every device
    fresh = readings(start, days=1, devices=5, step_minutes=30, seed=3)
    job = table.backfill(source=fresh, mode="replace", start=start, end=end).wait()
    assert all(c["passed"] for c in job.report()["checks"])
    assert sort_rows(table.to_arrow()).equals(after_replace(merged, fresh, start, end))

    field = ids(table)
    files = entries(table)
    assert len(files) == 5  # the first job's three days, the merge's two outside the replaced day, the replacement
    ts, device, value = field["ts"], field["device_id"], field["value"]
    for f in files:  # sorted on (device_id, ts): those keep bounds unless a mode of their own says otherwise
        bounded, counted = set(f.lower_bounds or {}), set(f.null_value_counts or {})
        assert set(f.upper_bounds or {}) == bounded
        assert (bounded, counted) == {"counts": ({ts, device}, {ts, device, value}),
                                      "none": ({ts, device}, {ts, device}),
                                      "time-none": ({device, value}, {device, value}),
                                      "all-none": (set(), set())}[mode]


@pytest.mark.parametrize("mode", ["time-none", "all-none"])
def test_a_staged_file_out_of_its_day_or_with_a_null_is_caught_from_its_footer(lake, readings, mode):
    """The entries hold no time bounds (nor, with every mode ``none``, null counts), so what a tampered file
    holds is read from its footer: a time moved to the next day fails the bounds check naming the file, and
    where the entries hold no null counts either, a null series fails the null check."""
    metered(lake, METRICS[mode])
    assert validate(lake.runtime, stage_job(lake, readings(recent(6), days=1, devices=3)))["passed"]  # untouched: passes
    job_id = stage_job(lake, readings(recent(4), days=1, devices=3))
    path = lake.runtime.store.units(job_id)[0].result["path"].removeprefix("file://")
    rows = pq.read_table(path)
    ts = micros(rows, "ts").copy()
    ts[-1] += 86_400_000_000  # the last row a day later: outside the file's partition
    late = rows.set_column(0, "ts", pa.array(ts).cast(rows.schema.field("ts").type))
    pq.write_table(late, path)
    with pytest.raises(ValidationFailed, match="time_bounds"):
        validate(lake.runtime, job_id)
    failed = {c["name"]: c for c in lake.runtime.store.get_job(job_id).state["checks"] if not c["passed"]}
    assert failed["time_bounds"]["samples"][0]["file"].endswith(path)
    if mode == "time-none":  # the entries keep the series' null counts: those are the ones checked
        return
    job_id = stage_job(lake, readings(recent(5), days=1, devices=3))
    path = lake.runtime.store.units(job_id)[0].result["path"].removeprefix("file://")
    rows = pq.read_table(path)
    nulled = rows.set_column(1, pa.field("device_id", pa.string()), pa.array([None] + rows.column("device_id").to_pylist()[1:]))
    pq.write_table(nulled, path)
    with pytest.raises(ValidationFailed, match="required_not_null"):
        validate(lake.runtime, job_id)
    failed = {c["name"]: c for c in lake.runtime.store.get_job(job_id).state["checks"] if not c["passed"]}
    assert failed["required_not_null"]["samples"] == [{"column": "device_id", "nulls": 1}]


def test_time_bounds_come_from_the_footers_where_the_manifests_hold_none(lake, readings):
    table = metered(lake, METRICS["time-none"])
    source = readings(recent(6), days=2, devices=2, step_minutes=45)
    table.backfill(source=source).wait()
    ts = micros(source, "ts")
    assert time_bounds(table.refresh().iceberg, "ts") == (int(ts.min()), int(ts.max()))


def test_a_rollup_declared_on_a_table_without_bounds_is_built_from_all_of_it(lake, readings):
    table = metered(lake, METRICS["time-none"])
    table.backfill(source=readings(recent(5), days=2, devices=2, step_minutes=30)).wait()
    table.declare(rollups=[{"interval": "1d", "columns": ["value"]}])
    base = table.to_arrow()  # noqa: F841 (read by DuckDB)
    rollup = lake.catalog.load_table("iot.sensor_1d").scan().to_arrow()  # noqa: F841
    expected = duckdb.sql("SELECT device_id, count(*) FROM base GROUP BY ALL ORDER BY ALL").fetchall()
    assert expected and duckdb.sql("SELECT device_id, sum(rows) FROM rollup GROUP BY ALL ORDER BY ALL").fetchall() == expected


def test_the_modes_are_read_as_iceberg_java_reads_them(lake):
    """`commit.metrics_modes` against the rules of Iceberg Java's ``MetricsConfig``: sort columns promoted under
    ``counts`` or ``none``, a column's own mode winning, a wide table's inferred limit, misspelt modes falling back."""
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("a", pa.float64()),
                        ("b", pa.float64())])
    table = lake.create_table("iot.wide", schema=schema, time_column="ts", series_key=["device_id"])

    def modes(**props: str) -> dict[str, str]:
        plan = metrics_modes(table.iceberg, {k.replace("__", "."): v for k, v in props.items()})
        default = plan.pop("write.metadata.metrics.default")
        return {"*": default, **{k.removeprefix("write.metadata.metrics.column."): v for k, v in plan.items()}}

    assert modes() == {"*": "truncate(16)", "device_id": "truncate(16)", "ts": "truncate(16)"}
    assert modes(write__metadata__metrics__default="counts") == {"*": "counts", "device_id": "truncate(16)", "ts": "truncate(16)"}
    assert modes(write__metadata__metrics__default="full") == {"*": "full", "device_id": "full", "ts": "full"}
    assert modes(**{"write__metadata__metrics__default": "none", "write__metadata__metrics__column__ts": "counts"}) == {
        "*": "none", "device_id": "truncate(16)", "ts": "counts"}
    assert modes(**{"write__metadata__metrics__max-inferred-column-defaults": "3"}) == {
        "*": "none", "ts": "truncate(16)", "device_id": "truncate(16)", "a": "truncate(16)"}  # b, the fourth: none
    assert modes(write__metadata__metrics__default="bogus")["*"] == "truncate(16)"
    assert modes(**{"write__metadata__metrics__default": "counts", "write__metadata__metrics__column__a": "bogus"})["a"] == "counts"
