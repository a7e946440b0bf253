"""A published range cut into pieces of follow-up work (one work item each on AWS) gives exactly the
rollups and rule events of the range done at once: each piece refreshes its own rollup chunks only,
and a rule episode that crosses a piece's edge still fires once."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

from tests.conftest import SCHEMA, make_readings, recent
from tests.followup.rules_reference import day, heat, recorded, reference
from timelake.followup.refresh import PublishedEvent, on_published, pieces
from timelake.model.timeutil import iso, parse_instant, to_micros


def _event(start: str, end: str, **extra) -> PublishedEvent:
    return PublishedEvent(job_id="bf-x", table="iot.sensor", start=start, end=end, **extra)


def _spans(work: list[PublishedEvent]) -> list[tuple[str, str]]:
    return [(p.start, p.end) for p in work]


@pytest.mark.parametrize("rollups", [[], [{"interval": "1h", "columns": ["value"]}]], ids=["rules_only", "hourly"])
def test_a_range_is_cut_at_day_edges_without_daily_rollups(lake, rollups):
    lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], rollups=rollups)
    start = iso(to_micros(parse_instant(recent(5))) + 6 * 3_600_000_000)  # 06:00, five days back
    work = pieces(lake.runtime, _event(start, recent(2)))
    assert _spans(work) == [(start, iso(to_micros(parse_instant(recent(4))))),
                            (iso(to_micros(parse_instant(recent(4)))), iso(to_micros(parse_instant(recent(3))))),
                            (iso(to_micros(parse_instant(recent(3)))), iso(to_micros(parse_instant(recent(2)))))]
    assert all(p.job_id == "bf-x" and p.table == "iot.sensor" for p in work)
    assert _spans(pieces(lake.runtime, work[1])) == [_spans(work)[1]]  # a piece is its own only piece


def test_daily_rollups_make_month_pieces(lake):
    lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                      rollups=[{"interval": "1h", "columns": ["value"]}, {"interval": "1d", "columns": ["value"]}])
    work = pieces(lake.runtime, _event("2026-01-20T00:00:00Z", "2026-03-02T12:00:00Z"))
    assert [(parse_instant(p.start).isoformat()[:10], parse_instant(p.end).isoformat()[:16]) for p in work] == [
        ("2026-01-20", "2026-02-01T00:00"), ("2026-02-01", "2026-03-01T00:00"), ("2026-03-01", "2026-03-02T12:00")]


def test_pieces_give_the_rollups_and_rule_events_of_the_whole_range(lake):
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                              retention="P3Y", rollups=[{"interval": "1h", "columns": ["value"]}],
                              rules=["hot: value > 80 for PT20M severity critical", "cold: value < 4"])
    rows = make_readings(recent(6), days=3, devices=3, step_minutes=10, seed=4)
    rows = heat(rows, "d01", day(5) - timedelta(minutes=40), day(5) + timedelta(minutes=30))  # across a piece's edge
    table.append(rows)
    whole = _event(recent(6), recent(3), evaluate_rules=True)
    work = pieces(lake.runtime, whole)
    assert len(work) == 3
    done = [on_published(lake.runtime, p) for p in work]
    expected = reference(rows, day(6), day(3))
    assert sum(d["events"] for d in done) == len(expected) and recorded(table, "backfill") == expected and expected
    by_pieces = _rollup(lake)
    at_once = on_published(lake.runtime, whole)
    assert at_once["rollups"] == {"iot.sensor_1h": sum(d["rollups"]["iot.sensor_1h"] for d in done)} == {"iot.sensor_1h": 216}
    assert _rollup(lake).equals(by_pieces)
    assert recorded(table, "backfill") == expected  # the whole range at once replaces the pieces' events: the same events


def _rollup(lake) -> pa.Table:
    return lake.catalog.load_table("iot.sensor_1h").scan().to_arrow().sort_by([("device_id", "ascending"), ("bucket_start", "ascending")])
