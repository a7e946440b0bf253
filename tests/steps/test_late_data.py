"""Late bulk data from live sources: a gateway's buffered dump goes through the backfill writer."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from tests.conftest import make_readings, recent, sort_rows


def test_append_as_backfill_routes_old_rows_to_the_backfill_writer(lake, sensor, readings):
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    sensor.append(make_readings(now - timedelta(days=4), days=1, devices=2, seed=1))  # what live ingestion had
    latest = make_readings(now - timedelta(hours=2), days=1 / 12, devices=2, seed=3)  # recent
    dump = pa.concat_tables([make_readings(now - timedelta(days=4), days=3, devices=2, seed=2), latest])  # days of outage
    before = sensor.refresh().iceberg.inspect.files().num_rows
    job = sensor.append(dump, as_backfill=True, older_than="PT6H")
    report = job.report()
    assert report["phase"] == "published" and report["rows_conflicting_existing"] == 48  # the live day wins
    files = sensor.refresh().iceberg.inspect.files()
    # one file per old day; the plain append of the recent rows writes a file per UTC day they touch (two
    # between 01:00 and 02:00, when the last two hours cross midnight)
    recent_days = len({t.date() for t in latest.column("ts").to_pylist()})
    assert files.num_rows - before == report["files"] + recent_days
    rows = sensor.to_arrow()
    assert rows.num_rows == 48 + (dump.num_rows - 48)
    assert sensor.append(make_readings(now - timedelta(hours=1), days=1 / 24, devices=1), as_backfill=True) is None


def test_a_gateway_json_lines_dump_is_backfilled_with_the_same_command(sensor, readings, tmp_path):
    dump = readings(recent(4), days=2, devices=3)
    path = tmp_path / "gateway-buffer.jsonl"
    with path.open("w") as out:
        for row in dump.to_pylist():
            out.write(json.dumps({"time": row["ts"].isoformat(), "sensor": row["device_id"], "reading": row["value"]}) + "\n")
    report = sensor.backfill(source=str(path), map={"ts": "time", "device_id": "sensor", "value": "reading"}).wait().report()
    assert report["rows_written"] == dump.num_rows and report["files"] == 2
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(dump))
