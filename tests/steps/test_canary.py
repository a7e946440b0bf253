"""Canary, embedded: one day written, staged and checked alone; continue finishes the job without
rewriting the canary's files; abort leaves nothing. References are computed with DuckDB."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import cli, make_readings, recent, reference_merge, sort_rows
from timelake.errors import Aborted, ValidationFailed

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture
def scene(sensor, tmp_path):
    """Main holds two devices on day -6; the export (naive Berlin wall-clock time, other column names)
    covers days -7 … -5 for three devices, with one corrected (duplicate) reading on day -6 and one
    row without a time (rejected)."""
    existing = make_readings(recent(6), days=1, devices=2, seed=1)
    sensor.append(existing)
    utc = make_readings(recent(7), days=3, devices=3, seed=2)
    utc = pa.concat_tables([utc, utc.slice(30, 1).set_column(2, "value", pa.array([123.0]))])
    local = pc.cast(pa.array([t.astimezone(BERLIN).replace(tzinfo=None) for t in utc.column("ts").to_pylist()]),
                    pa.timestamp("us"))
    export = tmp_path / "export"
    export.mkdir()
    raw = pa.table({"timestamp": local, "tag_name": utc.column("device_id"), "val": utc.column("value")})
    no_time = pa.table({"timestamp": pa.array([None], pa.timestamp("us")), "tag_name": ["d00"], "val": [1.0]})
    pq.write_table(pa.concat_tables([raw.slice(0, 150), no_time]), export / "a.parquet")  # one row rejected: no time
    pq.write_table(raw.slice(150), export / "b.parquet")
    return sensor, existing, utc, export


def _start(sensor, export: Path, canary):
    return sensor.backfill(source=f"{export}/*.parquet", map={"ts": "timestamp", "device_id": "tag_name", "value": "val"},
                           tz="Europe/Berlin", canary=canary, max_rejected=1).wait()  # the row without a time


def _day(table: pa.Table, day: str) -> pa.Table:
    start = datetime.fromisoformat(day).replace(tzinfo=timezone.utc)
    ts = table.column("ts")
    return table.filter(pc.and_(pc.greater_equal(ts, start), pc.less(ts, start + timedelta(days=1))))


def _unit_files(lake, job_id: str) -> dict[str, int]:
    return {u.result["path"]: os.stat(u.result["path"].removeprefix("file://")).st_mtime_ns
            for u in lake.runtime.store.units(job_id) if u.result.get("path")}


def test_canary_day_is_staged_alone_and_equals_the_reference(lake, scene):
    sensor, existing, utc, export = scene
    main_before = sensor.refresh().iceberg.metadata.refs["main"].snapshot_id
    job = _start(sensor, export, recent(6))
    record = job.record()
    assert record.phase == "awaiting-approval"
    branch = f"backfill/{job.id}"
    staged = sensor.refresh().to_arrow(ref=branch)
    reference = _day(reference_merge(existing, utc), recent(6))  # noqa: F841 (read by DuckDB by name)
    new_rows = duckdb.sql("SELECT r.* FROM reference r ANTI JOIN existing e USING (device_id, ts)").to_arrow_table()
    assert sort_rows(_day(staged, recent(6))).equals(sort_rows(reference))  # the branch's day is the reference day
    assert staged.num_rows == existing.num_rows + new_rows.num_rows  # the branch holds main plus the one day
    assert sensor.refresh().iceberg.metadata.refs["main"].snapshot_id == main_before
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(existing))
    assert lake.is_range_leased("iot.sensor", recent(5), recent(4))  # the whole job's range stays leased
    assert len(_unit_files(lake, job.id)) == 1

    canary = job.report()["canary"]
    day_source = _day(utc, recent(6))
    assert canary["day"] == recent(6) and canary["units"] == canary["files"] == 1
    assert canary["rows_in_source"] == day_source.num_rows
    assert canary["rows_written"] == new_rows.num_rows
    assert canary["rows_duplicate_in_source"] == 1
    assert canary["rows_conflicting_existing"] == day_source.num_rows - 1 - new_rows.num_rows
    assert all(c["passed"] for c in canary["checks"]) and {c["name"] for c in canary["checks"]} >= {
        "row_count_balance", "unique_keys_in_staged", "no_overlap_with_main", "aggregate_matches_source"}
    samples = canary["samples"]
    assert 1 <= len(samples) <= 5 and any(s["existing"] for s in samples)
    assert any(s["origin"].startswith("row ") and s["origin"].endswith("a.parquet") for s in samples)  # beside a rejected row
    for s in samples:
        local = datetime.fromisoformat(s["source"]["timestamp"]).replace(tzinfo=BERLIN)
        assert datetime.fromisoformat(s["mapped"]["ts"]) == local.astimezone(timezone.utc)
        assert (s["mapped"]["device_id"], s["mapped"]["value"]) == (s["source"]["tag_name"], s["source"]["val"])
        if s["existing"]:
            assert s["existing"]["ts"] == s["mapped"]["ts"] and s["outcome"].startswith("dropped")
    columns = {c["column"]: c for c in canary["columns"]}
    expected = duckdb.sql("SELECT min(value), max(value), count(*) FROM new_rows").fetchall()[0]
    assert (columns["value"]["staged"]["min"], columns["value"]["staged"]["max"], columns["value"]["staged"]["rows"]) == expected
    expected = duckdb.sql("SELECT min(value), max(value), count(*) FROM day_source").fetchall()[0]
    assert (columns["value"]["source"]["min"], columns["value"]["source"]["max"], columns["value"]["source"]["rows"]) == expected
    # the series column as its values, not the codes the spill stores it as
    assert (columns["device_id"]["source"]["min"], columns["device_id"]["source"]["max"]) == \
        duckdb.sql("SELECT min(device_id), max(device_id) FROM day_source").fetchall()[0]
    projected = canary["projected"]
    assert projected["rows_in_scope"] == utc.num_rows and projected["units"] == 3
    assert projected["estimated_cost"]["aws_usd"] > 0


def test_continue_gives_the_full_result_without_rewriting_the_canary(lake, scene):
    sensor, existing, utc, export = scene
    job = _start(sensor, export, True)
    assert job.record().state["canary"]["day"] == recent(7)  # true: the first day with rows
    canary_files = _unit_files(lake, job.id)
    job.approve(wait=True)
    assert job.record().phase == "published"
    assert sort_rows(sensor.refresh().to_arrow()).equals(reference_merge(existing, utc))
    assert job.report()["rows_rejected"]["reasons"] == {"null_time": 1}
    files = _unit_files(lake, job.id)
    assert len(files) == 3 and {p: files[p] for p in canary_files} == canary_files  # same paths, same mtimes
    on_main = {f.file_path for f in sensor.iceberg.scan().plan_files() for f in [f.file]}
    assert set(canary_files) <= on_main
    assert lake.leases() == [] and f"backfill/{job.id}" not in sensor.iceberg.metadata.refs
    assert all(c["passed"] for c in job.report()["checks"])
    assert json.loads(json.dumps(job.report()))["canary"]["day"] == recent(7)


def test_abort_after_the_canary_leaves_no_branch_lease_or_file(lake, scene):
    sensor, existing, _, export = scene
    main_before = sensor.refresh().iceberg.metadata.refs["main"].snapshot_id
    job = _start(sensor, export, recent(5))
    paths = [Path(p.removeprefix("file://")) for p in _unit_files(lake, job.id)]
    assert len(paths) == 1 and paths[0].exists()
    assert job.abort()["files_deleted"] == 1
    table = sensor.refresh().iceberg
    assert f"backfill/{job.id}" not in table.metadata.refs and table.metadata.refs["main"].snapshot_id == main_before
    assert lake.leases() == [] and not paths[0].exists()
    assert not Path(lake.runtime.config.staging.removeprefix("file://"), job.id).exists()
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(existing))


def test_an_approval_after_the_deadline_aborts_the_job_and_leaves_nothing(lake, scene):
    """Embedded, nothing watches the clock while the canary waits: the late approval itself aborts."""
    sensor, existing, _, export = scene
    main_before = sensor.refresh().iceberg.metadata.refs["main"].snapshot_id
    job = sensor.backfill(source=f"{export}/*.parquet", map={"ts": "timestamp", "device_id": "tag_name", "value": "val"},
                          tz="Europe/Berlin", canary=recent(6), approval_timeout_seconds=1, max_rejected=1).wait()
    waiting = job.report()
    since = job.record().state["awaiting_since"]
    assert waiting["phase"] == "awaiting-approval"
    assert datetime.fromisoformat(waiting["approval_deadline"].replace("Z", "+00:00")).timestamp() == pytest.approx(since + 1, abs=1e-3)
    paths = [Path(p.removeprefix("file://")) for p in _unit_files(lake, job.id)]
    assert paths and all(p.exists() for p in paths)
    while datetime.now(timezone.utc).timestamp() <= since + 1:
        time.sleep(0.05)
    with pytest.raises(Aborted, match=r"approval ran out at .* \(approval_timeout_seconds=1\); the job was aborted"):
        job.approve(wait=True)
    record = job.record()
    assert record.phase == "aborted" and record.state["error"].startswith("nobody approved the canary in time")
    assert job.report()["approval_deadline"] is None
    table = sensor.refresh().iceberg
    assert table.metadata.refs["main"].snapshot_id == main_before and f"backfill/{job.id}" not in table.metadata.refs
    assert lake.leases() == [] and not any(p.exists() for p in paths)
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(existing))


def test_a_canary_day_without_rows_is_refused_and_holds_nothing(lake, scene):
    sensor, existing, _, export = scene
    with pytest.raises(Aborted, match=r"canary day 2001-01-01 has no source rows in the job \(rows from "):
        _start(sensor, export, "2001-01-01")
    assert lake.leases() == [] and sort_rows(sensor.refresh().to_arrow()).equals(sort_rows(existing))
    assert [r for r in sensor.iceberg.metadata.refs] == ["main"]
    record = lake.jobs()[-1].record()
    assert record.phase == "aborted" and record.state["error"].startswith("canary day 2001-01-01 has no source rows")


def test_cli_canary_prints_the_report_and_continue_publishes(lake, scene, warehouse):
    sensor, existing, utc, export = scene
    args = ["backfill", "iot.sensor", "--from", f"{export}/*.parquet", "--map", "ts=timestamp,device_id=tag_name,value=val",
            "--tz", "Europe/Berlin", "--max-rejected", "1"]
    run = cli(*args, "--canary", recent(6), "--approval-timeout", "3600", warehouse=warehouse)
    job_id = lake.jobs()[-1].id
    record = lake.job(job_id).record()
    assert record.spec["approval_timeout_seconds"] == 3600
    assert f"canary {recent(6)}" in run.stdout and "sample rows" in run.stdout and "whole job:" in run.stdout
    assert f"timelake backfill continue {job_id}" in run.stdout
    deadline = lake.job(job_id).report()["approval_deadline"]
    assert f"approve before {deadline}" in run.stdout
    assert datetime.fromisoformat(deadline.replace("Z", "+00:00")).timestamp() == pytest.approx(record.state["awaiting_since"] + 3600, abs=1e-3)
    assert lake.job(job_id).record().phase == "awaiting-approval"
    report = json.loads(cli("backfill", "continue", job_id, "--json", warehouse=warehouse).stdout)
    assert report["phase"] == "published" and report["canary"]["day"] == recent(6)
    assert sort_rows(sensor.refresh().to_arrow()).equals(reference_merge(existing, utc))
    dry = json.loads(cli(*args, "--canary", "--dry-run", "--json", warehouse=warehouse).stdout)  # bare --canary, then a flag
    assert dry["phase"] == "dry_run_complete"
    refused = cli("backfill", "continue", dry["job_id"], warehouse=warehouse, check=False)
    assert refused.returncode == 1 and "is dry_run_complete, not awaiting-approval" in refused.stderr


def test_a_failed_check_on_the_canary_day_stops_the_job_before_the_rest(lake, scene):
    sensor, existing, _, export = scene
    job = sensor.backfill(source=f"{export}/*.parquet", map={"ts": "timestamp", "device_id": "tag_name", "value": "val"},
                          tz="Europe/Berlin", canary=recent(6), assertions=["SELECT * FROM staged WHERE device_id = 'd02'"],
                          max_rejected=1)
    with pytest.raises(ValidationFailed, match=r"validation failed \(assertion_1\).*24 failing row"):
        job.wait()
    record = job.record()
    assert record.phase == "failed_validation" and "canary_report" not in record.state
    assert len(_unit_files(lake, job.id)) == 1  # the other days were never written
    assert lake.leases() == [] and sort_rows(sensor.refresh().to_arrow()).equals(sort_rows(existing))
    assert f"backfill/{job.id}" in sensor.iceberg.metadata.refs  # kept for inspection, as for any failed validation


def test_the_canary_shows_the_days_rejects_first(lake, sensor, tmp_path, warehouse):
    """A day that looks right while rows are missing is what a canary is for: its rejected rows come first,
    each with why, beside the whole job's count against the reject budget."""
    days = [recent(d) for d in (4, 3)]
    lines = ["ts,device_id,value"]
    for day in days:
        for minute in range(0, 120, 2):
            value = "#ERR" if minute % 30 == 0 and day == days[0] else f"{minute / 2:.1f}"
            lines.append(f"{day}T{minute // 60:02d}:{minute % 60:02d}:00Z,d01,{value}")
    path = tmp_path / "day.csv"
    path.write_text("\n".join(lines) + "\n")
    bad = sum(1 for line in lines if line.endswith("#ERR"))
    args = ["backfill", "iot.sensor", "--from", str(path), "--on-bad-value", "reject", "--max-rejected", "5%"]
    run = cli(*args, "--canary", days[0], warehouse=warehouse)
    shown = " ".join(run.stdout[run.stdout.index(f"canary {days[0]}"):].split())
    assert shown.startswith(f"canary {days[0]}: {bad} rows of the day rejected or nulled; whole job: {bad} rejected or "
                            "nulled, within the budget of 5% = 6 rows")
    assert shown.index("rejected rows of the day") < shown.index("sample rows")
    waiting = lake.jobs()[-1]
    canary = waiting.report()["canary"]
    assert canary["rows_rejected_on_day"] == bad and len(canary["rejected_samples"]) == bad
    assert {s["reason"] for s in canary["rejected_samples"]} == {"bad_value in value"}
    assert [s["source"]["value"] for s in canary["rejected_samples"]] == ["#ERR"] * bad
    assert [s["origin"].split(" of ")[0] for s in canary["rejected_samples"]] == [
        f"line {i + 1}" for i, line in enumerate(lines) if line.endswith("#ERR")]
    over = cli(*args[:-2], "--canary", days[0], warehouse=warehouse, check=False)  # the default budget: 0.1 %
    assert over.returncode == 1 and "validation failed (reject_budget)" in over.stderr
    assert lake.jobs()[-1].record().phase == "failed_validation"
    assert [lease.job_id for lease in lake.leases("iot.sensor")] == [waiting.id]  # it took none: it failed before
