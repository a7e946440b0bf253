"""Rollups equal a from-scratch recomputation after merge, replace and chunked backfills, and rollup
rows outside the backfilled range stay exactly as they were."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from tests.conftest import SCHEMA, make_readings, recent
from timelake.followup.rollup import refresh


@pytest.fixture
def rolled(lake):
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                              retention="P3Y", rollups=[{"interval": "1h", "columns": ["value"]},
                                                        {"interval": "1d", "columns": ["value"]}])
    table.append(make_readings(recent(12), days=10, devices=3, step_minutes=20, seed=1))
    refresh(lake.runtime, "iot.sensor", recent(12), recent(2))  # what live maintenance would have built
    return table


def _reference(base: pa.Table, width_us: int) -> pa.Table:
    return duckdb.sql(f"""
        SELECT device_id, make_timestamptz(((epoch_us(ts) // {width_us}) * {width_us})::BIGINT) AS bucket_start,
               count(*) AS rows, min(value)::DOUBLE AS value_min, max(value)::DOUBLE AS value_max,
               sum(value)::DOUBLE AS value_sum, avg(value)::DOUBLE AS value_avg
        FROM base GROUP BY ALL ORDER BY ALL""").to_arrow_table()


def _rollup(lake, interval: str) -> pa.Table:
    rows = lake.catalog.load_table(f"iot.sensor_{interval}").scan().to_arrow()
    return rows.sort_by([("device_id", "ascending"), ("bucket_start", "ascending")])


def _assert_equal(got: pa.Table, expected: pa.Table) -> None:
    assert got.num_rows == expected.num_rows
    for name in expected.column_names:
        a, b = got.column(name).to_pylist(), expected.column(name).to_pylist()
        if name.startswith("value_"):
            assert a == pytest.approx(b), name
        else:
            assert a == b, name


def _outside(rollup: pa.Table, start: str, end: str) -> list[dict]:
    import datetime as dt

    lo = dt.datetime.fromisoformat(start).replace(tzinfo=dt.timezone.utc)
    hi = dt.datetime.fromisoformat(end).replace(tzinfo=dt.timezone.utc)
    return [r for r in rollup.to_pylist() if not (lo - dt.timedelta(days=1) <= r["bucket_start"] < hi + dt.timedelta(days=1))]


@pytest.mark.parametrize("mode, publish_by", [("merge", None), ("replace", None), ("merge", "day")])
def test_rollups_equal_a_recomputation_and_outside_rows_are_untouched(lake, rolled, mode, publish_by):
    before = {i: _rollup(lake, i) for i in ("1h", "1d")}
    source = make_readings(recent(8), days=2, devices=2, step_minutes=15, seed=5)  # replace: device d02 disappears
    kwargs = {"start": recent(8), "end": recent(6)} if mode == "replace" else {}
    report = rolled.backfill(source=source, mode=mode, publish_by=publish_by, **kwargs).wait().report()
    assert report["phase"] == "published"
    assert lake.job(report["job_id"]).record().state["rollups_refreshed"]
    base = rolled.to_arrow()  # noqa: F841 (read by DuckDB)
    for interval, width in (("1h", 3_600_000_000), ("1d", 86_400_000_000)):
        after = _rollup(lake, interval)
        _assert_equal(after, _reference(base, width))
        assert _outside(after, recent(8), recent(6)) == _outside(before[interval], recent(8), recent(6))
    if mode == "replace":
        hours = _rollup(lake, "1h").to_pylist()
        import datetime as dt

        lo = dt.datetime.fromisoformat(recent(8)).replace(tzinfo=dt.timezone.utc)
        assert not [r for r in hours if r["device_id"] == "d02" and lo <= r["bucket_start"] < lo + dt.timedelta(days=2)]


def test_rollup_definitions_are_checked(lake):
    with pytest.raises(ValueError, match="interval '5m'"):
        lake.create_table("iot.bad", schema=SCHEMA, time_column="ts", series_key=["device_id"], rollups=[{"interval": "5m"}])
    with pytest.raises(ValueError, match="'device_id' is not a numeric column"):
        lake.create_table("iot.bad2", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                          rollups=[{"interval": "1h", "columns": ["device_id"]}])
