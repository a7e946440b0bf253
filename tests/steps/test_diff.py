"""The diff of a reprocess: a range reprocessed under a changed mapping (a calibration fix) reports, per
day and series, the rows only before, only after and in both, the values changed and each column's sum
and count before and after; every number equals an independent computation, DuckDB SQL over main's rows
in the range at the snapshots before and after the publish. The dry run predicts the same diff, the
canary shows its day's before anyone approves it, and the reason travels to timelake.backfills and the
snapshot summary."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import cli_in_process, cli_main, make_readings, recent
from timelake.model.layout import read_range
from timelake.steps import diff as diff_step
from timelake.model.timeutil import parse_instant, to_micros

REASON = "calibration v2: value = raw * 1.02 + 0.1 for d00"
EXPORT_MAP = {"ts": "timestamp", "device_id": "device", "value": "raw"}


def _export(rows: pa.Table, calibrated: pa.Array) -> pa.Table:
    return pa.table({"timestamp": rows.column("ts"), "device": rows.column("device_id"), "raw": rows.column("value"),
                     "calibrated": calibrated})


@pytest.fixture
def scene(sensor, tmp_path):
    """Main holds days -10 … -7 of three devices, loaded from an export's raw column, and a live day -6.
    The fixed export maps value from its calibrated column: d00 scaled, d01 the same but one reading
    missing its value, d02 without day -8, a new device d03 on day -9, and one row twice (the later
    wins). The job replaces days -9 and -8."""
    first = make_readings(recent(10), days=4, devices=3, seed=3)
    v1 = tmp_path / "v1.parquet"
    pq.write_table(_export(first, first.column("value")), v1)
    sensor.backfill(source=str(v1), map=EXPORT_MAP).wait()
    sensor.append(make_readings(recent(6), days=1, devices=3, seed=4))
    device, raw = first.column("device_id"), first.column("value").to_numpy()
    calibrated = np.where(device.to_numpy(zero_copy_only=False) == "d00", np.round(raw * 1.02 + 0.1, 6), raw)
    fixed = _export(first, pa.array(calibrated, mask=np.arange(len(raw)) == 96 + 30))  # d01 at day -9, 06:00: no value
    day = pc.cast(pc.floor_temporal(fixed.column("timestamp"), unit="day"), pa.date32())
    gone = pc.and_(pc.equal(fixed.column("device"), "d02"), pc.equal(day, pa.scalar(parse_instant(recent(8)).date())))
    fixed = fixed.filter(pc.invert(gone))
    new = make_readings(recent(9), days=1, devices=4, seed=5).filter(pc.equal(pc.field("device_id"), "d03"))
    twice = fixed.slice(96 + 50, 1).set_column(3, "calibrated", pa.array([-1.0]))  # d01 at day -8, 02:00, corrected
    fixed = pa.concat_tables([fixed, _export(new, new.column("value")), twice])
    v2 = tmp_path / "v2.parquet"
    pq.write_table(fixed, v2)
    return {"table": sensor.refresh(), "v2": v2, "start": recent(9), "end": recent(7)}


def _spec(scene: dict) -> dict:
    return {"source": str(scene["v2"]), "map": {**EXPORT_MAP, "value": "calibrated"}, "mode": "replace",
            "start": scene["start"], "end": scene["end"]}


def reference(before: pa.Table, after: pa.Table, keys: list[str], series: list[str], columns: list[str]) -> pa.Table:
    """Per UTC day and series, from the rows of both sides alone: DuckDB's full outer join on the key."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("b", before.append_column("_b", pa.array(np.ones(before.num_rows, dtype=np.int8))))
    con.register("a", after.append_column("_a", pa.array(np.ones(after.num_rows, dtype=np.int8))))
    both = "_b IS NOT NULL AND _a IS NOT NULL"
    distinct = lambda c: f"b.{c} IS DISTINCT FROM a.{c}"  # noqa: E731
    label = " || '|' || ".join(f"CAST(coalesce(b.{s}, a.{s}) AS VARCHAR)" for s in series) if series else "''"
    numeric = {c for c in columns if pa.types.is_integer(before.schema.field(c).type) or pa.types.is_floating(before.schema.field(c).type)}
    total = lambda side, c: f"coalesce(sum({side}.{c}), 0)::DOUBLE" if c in numeric else "0::DOUBLE"  # noqa: E731
    per_column = ", ".join(
        f"{total('b', c)} AS \"{c}.sum_before\", {total('a', c)} AS \"{c}.sum_after\", "
        f"count(b.{c}) AS \"{c}.count_before\", count(a.{c}) AS \"{c}.count_after\", "
        f"count(*) FILTER (WHERE {both} AND {distinct(c)}) AS \"{c}.changed\"" for c in columns)
    any_changed = " OR ".join(distinct(c) for c in columns)
    on = " AND ".join(f"b.{k} = a.{k}" for k in keys)
    return con.sql(f"""
        SELECT CAST(coalesce(b.ts, a.ts) AS DATE) AS day, {label} AS series,
               count(_b) AS rows_before, count(_a) AS rows_after,
               count(*) FILTER (WHERE _a IS NULL) AS only_before, count(*) FILTER (WHERE _b IS NULL) AS only_after,
               count(*) FILTER (WHERE {both}) AS in_both, count(*) FILTER (WHERE {both} AND ({any_changed})) AS changed,
               {per_column}
        FROM b FULL OUTER JOIN a ON {on}
        GROUP BY 1, 2 ORDER BY 1, 2""").to_arrow_table()


def assert_cells(cells: pa.Table, expected: pa.Table) -> None:
    got = {(r["day"], r["series"]): r for r in cells.to_pylist()}
    want = {(r["day"], r["series"]): r for r in expected.to_pylist()}
    assert sorted(got) == sorted(want)
    for key, row in want.items():
        for name, value in row.items():
            if isinstance(value, float):
                assert math.isclose(got[key][name], value, rel_tol=1e-9, abs_tol=1e-6), (key, name)
            else:
                assert got[key][name] == value, (key, name)


def _range_rows(table, start: str, end: str, snapshot_id: int) -> pa.Table:
    return read_range(table.iceberg, "ts", to_micros(parse_instant(start)), to_micros(parse_instant(end)),
                      snapshot_id=snapshot_id)


def cli(*args: str, warehouse: Path) -> str:
    """``timelake ARGS`` in this process; its standard output, after checking that it succeeded."""
    code, out, err = cli_main(*args, "--warehouse", str(warehouse))
    assert code == 0, err
    return out


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], str] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "cell" in (a.get("class") or "").split() and a.get("data-day"):
            self.cells[(a["data-series"], a["data-day"])] = a["data-state"]


def test_reprocess_under_a_new_mapping_reports_the_diff_main_shows(lake, scene, warehouse, tmp_path):
    table, spec = scene["table"], _spec(scene)
    dry = table.backfill(**spec, dry_run=True, reason=REASON).wait()
    predicted = dry.diff()
    assert predicted["predicted"] and dry.report()["phase"] == "dry_run_complete"

    # a canary on day -9 waits with that day's diff, before anyone approves it
    started = cli("backfill", "iot.sensor", "--from", spec["source"], "--map", "ts=timestamp,device_id=device,value=calibrated",
                  "--mode", "replace", "--start", spec["start"], "--end", spec["end"], "--canary", recent(9),
                  "--reason", REASON, warehouse=warehouse)
    assert "what the day changes on main:" in started
    job = lake.jobs()[-1]
    assert job.record().phase == "awaiting-approval"
    shown = json.loads(cli("backfill", "diff", job.id, "--json", warehouse=warehouse))
    canary = job.report()["canary"]["diff"]
    assert shown["scope"] == "canary" and shown["totals"] == canary["totals"]
    assert {c["day"] for c in shown["cells"]} == {recent(9)}

    before = table.refresh().iceberg.current_snapshot().snapshot_id
    job.approve(wait=True)
    after = table.refresh().iceberg.current_snapshot().snapshot_id
    assert job.report()["phase"] == "published"

    expected = reference(_range_rows(table, spec["start"], spec["end"], before), _range_rows(table, spec["start"], spec["end"], after),
                         ["device_id", "ts"], ["device_id"], ["value"])
    found = job.diff()
    assert found["scope"] == "job" and not found["predicted"]
    assert_cells(found["cells"], expected)
    assert found["cells"].equals(predicted["cells"])  # the dry run predicted every cell
    canary_day = expected.filter(pc.equal(expected.column("day"), pa.scalar(parse_instant(recent(9)).date())))
    assert_cells(pa.Table.from_pylist([{**c, "day": parse_instant(c["day"]).date()} for c in shown["cells"]]), canary_day)

    # what the scene changed, in numbers the reference agrees with
    totals = found["totals"]
    assert totals["only_before"] == 24 and totals["only_after"] == 24 and totals["changed"] == 48 + 1 + 1  # d00, d01 twice
    assert totals["rows_before"] == job.report()["rows_replaced"] and job.report()["diff"]["totals"] == totals
    value = found["by_column"][0]
    assert value["count_delta"] == -24 + 24 - 1 and value["changed"] == totals["changed"]
    assert value["match_share"] == pytest.approx(1 - totals["changed"] / totals["in_both"])
    assert {s["key"]["device_id"] for s in found["samples"]["only_after"]} == {"d03"}
    assert {s["key"]["device_id"] for s in found["samples"]["only_before"]} == {"d02"}
    change = found["samples"]["changed"][0]  # its values are main's before and after
    old = _range_rows(table, spec["start"], spec["end"], before).to_pylist()
    new = _range_rows(table, spec["start"], spec["end"], after).to_pylist()
    key = (change["key"]["device_id"], change["key"]["ts"])
    assert change["before"]["value"] == next(r["value"] for r in old if (r["device_id"], r["ts"].isoformat()) == key)
    assert change["after"]["value"] == next(r["value"] for r in new if (r["device_id"], r["ts"].isoformat()) == key)

    # the explanation stays with the table: timelake.backfills and the publish snapshot's summary
    history = table.history().to_pylist()[-1]
    assert history["job_id"] == job.id and history["reason"] == REASON
    assert (history["diff_only_before"], history["diff_only_after"], history["diff_changed"]) == (
        totals["only_before"], totals["only_after"], totals["changed"])
    assert json.loads(history["diff"])["by_day"] == found["by_day"]
    summary = table.refresh().iceberg.snapshot_by_id(after).summary
    assert summary["timelake.reason"] == REASON and summary["timelake.diff.changed"] == str(totals["changed"])

    # text, JSON and the page agree with the reference
    page = tmp_path / "diff.html"
    text = cli("backfill", "diff", job.id, "--html", str(page), warehouse=warehouse)
    assert f"reason: {REASON}" in text and f"{totals['rows_before']:,} before, {totals['rows_after']:,} after" in text
    as_json = json.loads(cli("backfill", "diff", job.id, "--json", warehouse=warehouse))
    assert as_json["totals"] == totals and len(as_json["cells"]) == expected.num_rows
    assert shutil.which("chromium"), "chromium is missing: `make test-deps` installs it"
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=90, check=True).stdout
    parser = _Cells()
    parser.feed(dom)
    states = {}
    for r in expected.to_pylist():
        differing = r["only_before"] + r["only_after"] + r["changed"]
        states[(r["series"], r["day"].isoformat())] = ("added" if not r["rows_before"] else "removed" if not r["rows_after"]
                                                      else "same" if not differing else "changed")
    days = {d for _, d in states}
    assert {k: v for k, v in parser.cells.items() if v != "empty"} == states
    assert {d for _, d in parser.cells} == days


PLANT = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("site", pa.string()), ("device", pa.string()),
                   ("value", pa.float64()), ("reading", pa.int64()), ("unit", pa.string())])


def _plant(start: str, days: float, seed: int, sites: tuple[str, ...] = ("north", "south"), devices: int = 3) -> pa.Table:
    rows = make_readings(start, days=days, devices=devices, seed=seed)
    tables = []
    for i, site in enumerate(sites):
        value = rows.column("value").to_numpy() + 1000 * i
        tables.append(pa.table({"ts": rows.column("ts"), "site": [site] * rows.num_rows, "device": rows.column("device_id"),
                                "value": value, "reading": np.rint(value * 10).astype(np.int64),
                                "unit": ["kWh"] * rows.num_rows}, schema=PLANT))
    return pa.concat_tables(tables)


def test_many_units_a_partition_tiers_and_a_two_column_series_key(lake, tmp_path, monkeypatch):
    """Units of a few series each (a tiny target file size cuts a day into several), day and month
    partitions, a series key of two columns (matched by Arrow's join, not packed keys), a text and an
    integer column beside the double; a replace job and then a merge job into a range partly on main.
    The cells are combined a few units at a time, as a job of thousands of units combines them."""
    monkeypatch.setattr(diff_step, "GROUP_UNITS", 5)
    plant = lake.create_table("iot.plant", schema=PLANT, time_column="ts", series_key=["site", "device"],
                              partition_by={"P30D": "day", None: "month"}, retention="P3Y", target_file_size="2KB")
    plant.backfill(source=_plant(recent(45), 20, seed=1)).wait()
    fixed = _plant(recent(40), 13, seed=1)
    site = fixed.column("site")
    fixed = fixed.set_column(3, "value", pc.if_else(pc.equal(site, "north"), pc.multiply(fixed.column("value"), 1.5),
                                                    fixed.column("value")))
    fixed = fixed.set_column(5, "unit", pc.if_else(pc.equal(fixed.column("device"), "d01"), "MWh", fixed.column("unit")))
    day = pc.cast(pc.floor_temporal(fixed.column("ts"), unit="day"), pa.date32())
    fixed = fixed.filter(pc.invert(pc.and_(pc.equal(fixed.column("device"), "d02"),
                                           pc.equal(day, pa.scalar(parse_instant(recent(33)).date())))))
    fixed = pa.concat_tables([fixed, _plant(recent(31), 2, seed=2, sites=("east",), devices=1)])
    keys, series, columns = ["site", "device", "ts"], ["site", "device"], ["value", "reading", "unit"]

    start, end = recent(40), recent(27)
    dry = plant.backfill(source=fixed, mode="replace", start=start, end=end, dry_run=True).wait().diff()
    before = plant.refresh().iceberg.current_snapshot().snapshot_id
    job = plant.backfill(source=fixed, mode="replace", start=start, end=end).wait()
    after = plant.refresh().iceberg.current_snapshot().snapshot_id
    units = lake.runtime.store.units(job.id)
    assert len(units) > len({u.info["partition"] for u in units}) > 1  # several units in a partition
    assert len(diff_step._stretches(units, *(lake.runtime.store.get_job(job.id).state[k] for k in ("range_start", "range_end")))) > 2
    assert {u.info["transform"] for u in units} == {"day", "month"}
    expected = reference(_range_rows(plant, start, end, before), _range_rows(plant, start, end, after), keys, series, columns)
    found = job.diff()
    assert_cells(found["cells"], expected)
    assert found["cells"].equals(dry["cells"])
    assert {c["column"]: c["changed"] for c in found["by_column"]}["unit"] == pc.sum(expected.column("unit.changed")).as_py() > 0
    assert "north|d00" in found["cells"].column("series").to_pylist()

    later = pa.concat_tables([_plant(recent(27), 5, seed=9)])  # days -27 … -25 on main (other values), -24 … -23 new
    start, end = recent(27), recent(22)
    predicted = plant.backfill(source=later, start=start, end=end, dry_run=True).wait().diff()
    before = plant.refresh().iceberg.current_snapshot().snapshot_id
    merged = plant.backfill(source=later, start=start, end=end).wait()
    after = plant.refresh().iceberg.current_snapshot().snapshot_id
    expected = reference(_range_rows(plant, start, end, before), _range_rows(plant, start, end, after), keys, series, columns)
    found = merged.diff()
    assert_cells(found["cells"], expected)
    assert found["cells"].equals(predicted["cells"])
    assert found["totals"]["changed"] == 0 and found["totals"]["only_before"] == 0
    assert found["totals"]["in_both"] == found["totals"]["rows_before"] > 0
    assert found["totals"]["only_after"] == merged.report()["rows_written"] > 0


def test_no_series_key_append_and_no_diff(lake, readings, tmp_path, warehouse):
    """A table without a series key has one series per day; an append job and a job run without a diff
    have none, and say so in one line."""
    flat = lake.create_table("iot.flat", schema=pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("value", pa.float64())]),
                             time_column="ts", partition_by="day")
    rows = make_readings(recent(5), days=3, devices=1, seed=1).select(["ts", "value"])
    flat.backfill(source=rows).wait()
    later = rows.slice(0, 40).set_column(1, "value", pc.add(rows.slice(0, 40).column("value"), 1.0))  # 40 of 48 hours
    before = flat.refresh().iceberg.current_snapshot().snapshot_id
    job = flat.backfill(source=later, mode="replace", start=recent(5), end=recent(3)).wait()
    after = flat.refresh().iceberg.current_snapshot().snapshot_id
    expected = reference(_range_rows(flat, recent(5), recent(3), before), _range_rows(flat, recent(5), recent(3), after),
                         ["ts"], [], ["value"])
    assert_cells(job.diff()["cells"], expected)
    assert job.diff()["totals"]["only_before"] == 8 and job.diff()["by_series"][0]["series"] == ""

    appended = flat.backfill(source=make_readings(recent(9), days=1, devices=1).select(["ts", "value"]), mode="append").wait()
    pq.write_table(later, tmp_path / "later.parquet")
    cli("backfill", "iot.flat", "--from", str(tmp_path / "later.parquet"), "--mode", "replace", "--start", recent(5),
        "--end", recent(3), "--no-diff", "--json", warehouse=warehouse)
    quiet = lake.jobs()[-1]
    assert quiet.record().spec["diff"] is False and quiet.report()["phase"] == "published" and quiet.report()["diff"] is None
    for job_id, why in ((appended.id, "(mode append): it has no diff"), (quiet.id, "ran without a diff (diff: false)")):
        code, stderr = cli_in_process("backfill", "diff", job_id, "--warehouse", str(warehouse))
        assert code == 1 and stderr.startswith(f"error: job {job_id} ") and why in stderr and len(stderr.splitlines()) == 1


def test_a_merge_into_a_month_partition_over_some_of_its_days_reports_those_days_alone(lake, tmp_path):
    """A month partition held whole by its scan task is written by one unit that counts main's rows of the
    whole month as it drops the keys main holds; the diff is of the job's range, so only its days count."""
    from tests.conftest import SCHEMA

    table = lake.create_table("iot.monthly", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="month", retention="P3Y", target_file_size="64MB")
    table.append(make_readings("2026-03-01", days=31, devices=2, step_minutes=360, seed=1), evaluate_rules=False)
    source = tmp_path / "later.parquet"
    pq.write_table(make_readings("2026-03-10", days=5, devices=3, step_minutes=180, seed=2), source)
    start, end = "2026-03-10T00:00:00Z", "2026-03-15T00:00:00Z"
    before = table.refresh().iceberg.current_snapshot().snapshot_id
    job = table.backfill(source=str(source), start=start, end=end).wait()
    units = lake.runtime.store.units(job.id)
    assert [u.info.get("main_counted") for u in units] == [True]  # the unit counted main: no main task read it
    after = table.refresh().iceberg.current_snapshot().snapshot_id
    expected = reference(_range_rows(table, start, end, before), _range_rows(table, start, end, after),
                         ["device_id", "ts"], ["device_id"], ["value"])
    found = job.diff()
    assert_cells(found["cells"], expected)
    assert sorted({str(d) for d in found["cells"].column("day").to_pylist()}) == [f"2026-03-{d}" for d in range(10, 15)]
    assert found["totals"]["rows_before"] == 5 * 4 * 2 and found["totals"]["only_after"] == job.report()["rows_written"] > 0
