"""Rollups equal a from-scratch recomputation after merge, replace and chunked backfills, and rollup
rows outside the backfilled range stay exactly as they were."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import SCHEMA, make_readings, recent
from timelake.followup.rollup import commit_range, prepare_range, refresh, refresh_range, rollups_of, widen
from timelake.model.timeutil import parse_instant, to_micros


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
    lo = dt.datetime.fromisoformat(start).replace(tzinfo=dt.UTC)
    hi = dt.datetime.fromisoformat(end).replace(tzinfo=dt.UTC)
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
        lo = dt.datetime.fromisoformat(recent(8)).replace(tzinfo=dt.UTC)
        assert not [r for r in hours if r["device_id"] == "d02" and lo <= r["bucket_start"] < lo + dt.timedelta(days=2)]


def test_rollup_definitions_are_checked(lake):
    with pytest.raises(ValueError, match="interval '5m'"):
        lake.create_table("iot.bad", schema=SCHEMA, time_column="ts", series_key=["device_id"], rollups=[{"interval": "5m"}])
    with pytest.raises(ValueError, match="'device_id' is not a numeric column"):
        lake.create_table("iot.bad2", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                          rollups=[{"interval": "1h", "columns": ["device_id"]}])


def _span(r, start: str, end: str) -> tuple[int, int]:
    return widen(r, to_micros(parse_instant(start)), to_micros(parse_instant(end)))


def test_a_refresh_computed_from_an_older_base_never_replaces_a_newer_one(lake, rolled):
    """Two refreshes of overlapping ranges race (two published chunks in one month, two Lambdas): the
    one that read the base before a publish and commits last must not put its stale rows back."""
    daily = next(r for r in rollups_of(rolled.iceberg) if r.interval == "1d")
    lo, hi = _span(daily, recent(8), recent(6))
    stale = prepare_range(lake.runtime, "iot.sensor", daily, lo, hi)  # reads the base before the append
    rolled.append(make_readings(recent(8), days=2, devices=5, step_minutes=30, seed=9).filter(
        pc.field("device_id") == "d04"))
    assert refresh_range(lake.runtime, "iot.sensor", daily, lo, hi) > 0  # reads the base after it
    assert commit_range(stale) is False
    assert stale.files and not any(Path(f.file_path.removeprefix("file://")).exists() for f in stale.files)
    base = rolled.to_arrow()  # noqa: F841 (read by DuckDB)
    got = _rollup(lake, "1d")
    assert "d04" in got.column("device_id").to_pylist()
    _assert_equal(got, _reference(base, 86_400_000_000))


def test_refreshes_of_ranges_that_do_not_overlap_both_go_in(lake, rolled):
    hourly = next(r for r in rollups_of(rolled.iceberg) if r.interval == "1h")
    first = prepare_range(lake.runtime, "iot.sensor", hourly, *_span(hourly, recent(8), recent(7)))
    rolled.append(make_readings(recent(8), days=2, devices=5, step_minutes=30, seed=9).filter(
        pc.field("device_id") == "d04"))
    refresh_range(lake.runtime, "iot.sensor", hourly, *_span(hourly, recent(7), recent(6)))
    assert commit_range(first) is True  # the other commit only moved main: retried on fresh metadata, not recomputed
    got = _rollup(lake, "1h").to_pylist()
    day8 = dt.datetime.fromisoformat(recent(8)).replace(tzinfo=dt.UTC)
    d04 = {r["bucket_start"] for r in got if r["device_id"] == "d04"}
    assert d04 and min(d04) >= day8 + dt.timedelta(days=1), "day 8 was computed before d04 arrived, day 7 after"
