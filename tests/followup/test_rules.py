"""Rules: historical data never fires a real-time alarm. A live append that breaks a rule calls the
sink (so the sink is wired and could be called); a backfill never does, with or without
``evaluate_rules``; with it, the events table holds exactly what a reference evaluation finds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import timelake
from tests.conftest import SCHEMA, make_readings, recent
from tests.followup.rules_reference import day, heat, recorded, reference
from timelake.adapters.local import InProcessAlarms
from timelake.followup.rules import evaluate_live, rules_of

RULES = ["hot: value > 80 for PT20M severity critical", "cold: value < 4"]


@pytest.fixture
def sink() -> InProcessAlarms:
    return InProcessAlarms()


@pytest.fixture
def ruled(warehouse, sink):
    """A table with rules and three days of live data [d12, d9); device d01 runs hot from d11 on."""
    lake = timelake.connect(warehouse=warehouse, alarms=sink)
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", retention="P3Y", rules=RULES)
    live = make_readings(recent(12), days=3, devices=3, step_minutes=10, seed=1)
    live = heat(live, "d01", day(11), day(9))  # a two-day episode still running at the live data's end
    live = heat(live, "d00", day(9) - timedelta(minutes=20), day(9))  # starts just before the backfill range
    table.append(live)
    return table


def backfill_source() -> pa.Table:
    rows = make_readings(recent(9), days=2, devices=3, step_minutes=10, seed=2)
    rows = heat(rows, "d01", day(9), day(9) + timedelta(hours=1))  # the live episode goes on into the range
    rows = heat(rows, "d00", day(9), day(9) + timedelta(minutes=30))  # fires at d9 + 0: the run began in live data
    return heat(rows, "d02", day(8) + timedelta(hours=3), day(8) + timedelta(hours=4), value=1.0)


def test_the_live_path_alarms_and_the_sink_sees_every_live_event(ruled, sink):
    expected = reference(ruled.to_arrow())
    assert expected, "the live data must break a rule for this test to mean anything"
    assert sorted((e["rule"], e["device_id"]) for _, e in sink.sent) == sorted((e[0], e[1]) for e in expected)
    assert recorded(ruled, "live") == expected
    assert evaluate_live(ruled.lake.runtime, ruled.name, ruled.to_arrow()) == 0  # evaluated again: nothing new
    assert len(sink.sent) == len(expected)


@pytest.mark.parametrize("evaluate_rules", [False, True])
def test_a_backfill_never_calls_the_sink(ruled, sink, evaluate_rules):
    live_alarms = list(sink.sent)
    job = ruled.backfill(source=backfill_source(), evaluate_rules=evaluate_rules).wait()
    assert job.record().phase == "published"
    assert sink.sent == live_alarms
    if not evaluate_rules:
        assert recorded(ruled, "backfill") == []
        return
    state = job.record().state
    lo = datetime.fromtimestamp(state["range_start"] / 1e6, UTC)
    hi = datetime.fromtimestamp(state["range_end"] / 1e6, UTC)
    expected = reference(ruled.to_arrow(), lo, hi)
    got = recorded(ruled, "backfill")
    assert got == expected and state["rule_events"] == len(expected)
    names = {(e[0], e[1], e[2]) for e in got}
    assert ("hot", "d00", day(9) - timedelta(minutes=20)) in names  # context before the range was read
    assert not any(e[0] == "hot" and e[1] == "d01" and e[2] < day(9) for e in got)  # the long episode fired live
    assert {e["job_id"] for e in ruled.events().filter(pc.equal(ruled.events().column("source"), "backfill")).to_pylist()} == {job.id}


def test_re_evaluating_a_published_job_replaces_its_events(ruled):
    from timelake.followup import refresh as followup

    job = ruled.backfill(source=backfill_source(), evaluate_rules=True).wait()
    first = recorded(ruled, "backfill")
    followup.run(ruled.lake.runtime, job.id)  # what a retried event or a resumed job does
    assert recorded(ruled, "backfill") == first and first


def test_rule_definitions_are_checked(lake):
    cases = [("hot: device_id > 3", "'device_id' is not a numeric column"),
             ("hot value > 3", "cannot read rule"),
             ({"name": "m", "column": "value", "op": ">", "threshold": 1, "for": "P1M"}, "fixed-length"),
             ({"name": "m", "column": "value", "op": "!=", "threshold": 1}, "op"),
             ({"name": "m; DROP", "column": "value", "op": ">", "threshold": 1}, "name")]
    for i, (rule, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            lake.create_table(f"iot.bad{i}", schema=SCHEMA, time_column="ts", series_key=["device_id"], rules=[rule])
    with pytest.raises(ValueError, match="unique"):
        lake.create_table("iot.dup", schema=SCHEMA, time_column="ts", rules=["a: value > 1", "a: value < 0"])


def test_declare_adds_a_rollup_built_from_the_whole_table_and_rules(lake, readings):
    import duckdb

    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], retention="P3Y")
    table.append(readings(recent(5), days=2, devices=2, step_minutes=30))
    table.declare(rollups=[{"interval": "1d", "columns": ["value"]}], rules=["hot: value > 99"])
    base = table.to_arrow()  # noqa: F841 (read by DuckDB)
    expected = duckdb.sql("SELECT device_id, count(*) FROM base GROUP BY ALL ORDER BY ALL").fetchall()
    rollup = lake.catalog.load_table("iot.sensor_1d").scan().to_arrow()  # noqa: F841
    assert duckdb.sql("SELECT device_id, sum(rows) FROM rollup GROUP BY ALL ORDER BY ALL").fetchall() == expected
    assert [r.name for r in rules_of(table.refresh().iceberg)] == ["hot"]


def test_runs_end_at_a_series_boundary_and_at_a_null_and_nan_is_above_every_threshold(lake):
    """Rows in no particular order, a two-column series key: a run at the end of one series does not go
    on into the next, a null ends a run, and NaN meets ``>`` but not ``<`` (the order SQL engines use)."""
    from timelake.followup.rules import evaluate, parse
    from timelake.model.contract import Contract

    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("site", pa.string()), ("device_id", pa.string()),
                        ("value", pa.float64())])
    table = lake.create_table("iot.sites", schema=schema, time_column="ts", series_key=["site", "device_id"])
    t = [datetime(2026, 3, 1, tzinfo=UTC) + timedelta(minutes=m) for m in range(5)]
    nan = float("nan")
    series = {("s1", "a"): [90, 90, 90], ("s1", "b"): [90, None, 90, 90, 90], ("s2", "a"): [nan, nan, nan],
              ("s2", "b"): [3, 2, 5, 1]}
    rows = [(t[i], site, device, v) for (site, device), values in series.items() for i, v in enumerate(values)]
    rows = [rows[i] for i in (7, 0, 12, 3, 9, 14, 1, 5, 10, 2, 13, 6, 8, 11, 4)]
    arrow = pa.table(list(zip(*rows, strict=True)), schema=schema)
    rules = parse(["hot: value > 80 for PT2M", "cold: value < 4"], schema)
    contract = Contract.from_table(table.iceberg)

    def events(lo: datetime | None) -> list[tuple]:
        got = evaluate(arrow, contract, rules, None if lo is None else int(lo.timestamp() * 1e6), None).to_pylist()
        return [(e["rule"], e["site"], e["device_id"], t.index(e["started_at"]), t.index(e["fired_at"]),
                 "nan" if e["value"] != e["value"] else e["value"]) for e in got]

    assert events(None) == [("cold", "s2", "b", 0, 0, 3.0), ("cold", "s2", "b", 3, 3, 1.0),
                            ("hot", "s1", "a", 0, 2, 90.0), ("hot", "s1", "b", 2, 4, 90.0), ("hot", "s2", "a", 0, 2, "nan")]
    assert events(t[1]) == events(None)[1:]  # the range cuts on the firing time; a run may begin before it
