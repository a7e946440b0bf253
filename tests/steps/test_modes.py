"""Merge, replace and append produce exactly what an independent reference computes."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import SCHEMA, duplicate_keys, recent, reference_merge, sort_rows
from datetime import UTC


def _existing_and_source(sensor, readings):
    existing = readings(recent(10), days=3, devices=3, seed=1)
    sensor.append(existing)
    # overlaps the last two existing days, extends two days further, and repeats some keys with new values
    source = readings(recent(9), days=4, devices=4, seed=2)
    repeat = source.slice(0, 10)
    repeat = repeat.set_column(2, "value", pc.add(repeat.column("value"), 1000.0))
    return existing, pa.concat_tables([source, repeat])


def test_merge_keeps_existing_rows_and_adds_the_rest(sensor, readings):
    existing, source = _existing_and_source(sensor, readings)
    job = sensor.backfill(source=source, mode="merge").wait()
    report = job.report()
    assert sort_rows(sensor.to_arrow()).equals(reference_merge(existing, source))
    assert report["phase"] == "published"
    assert report["rows_duplicate_in_source"] == 10
    expected_conflicts = duckdb.sql(
        "SELECT count(*) FROM (SELECT DISTINCT device_id, ts FROM source) SEMI JOIN existing USING (device_id, ts)"
    ).fetchall()[0][0]
    assert report["rows_conflicting_existing"] == expected_conflicts
    assert report["rows_written"] == sensor.to_arrow().num_rows - existing.num_rows
    assert all(c["passed"] for c in report["checks"])
    assert len(report["published_snapshot_ids"]) == 1


def test_replace_swaps_the_range_atomically(sensor, readings):
    existing, source = _existing_and_source(sensor, readings)
    start, end = recent(9), recent(7)
    job = sensor.backfill(source=source, mode="replace", start=start, end=end).wait()
    con = duckdb.connect()
    con.register("existing", existing)
    con.register("source", source.append_column("__pos", pa.array(range(source.num_rows))))
    expected = con.sql(f"""
        SELECT ts, device_id, value FROM existing WHERE NOT (ts >= '{start}'::TIMESTAMPTZ AND ts < '{end}'::TIMESTAMPTZ)
        UNION ALL
        SELECT ts, device_id, value FROM (
            SELECT *, row_number() OVER (PARTITION BY device_id, ts ORDER BY __pos DESC) AS r FROM source
            WHERE ts >= '{start}'::TIMESTAMPTZ AND ts < '{end}'::TIMESTAMPTZ) WHERE r = 1
        ORDER BY device_id, ts""").to_arrow_table().cast(SCHEMA)
    assert sort_rows(sensor.to_arrow()).equals(expected)
    report = job.report()
    assert report["rows_outside_range"] == source.num_rows - pc.sum(pc.and_(
        pc.greater_equal(source.column("ts"), pa.scalar(pc.strptime(start, "%Y-%m-%d", "us").as_py(), SCHEMA.field("ts").type)),
        pc.less(source.column("ts"), pa.scalar(pc.strptime(end, "%Y-%m-%d", "us").as_py(), SCHEMA.field("ts").type)),
    ).cast(pa.int64())).as_py()


def test_append_adds_without_key_check_and_reports_overlap(sensor, readings):
    existing = readings(recent(10), days=2, devices=2, seed=1)
    sensor.append(existing)
    source = readings(recent(9), days=2, devices=2, seed=2)  # one day overlaps
    report = sensor.backfill(source=source, mode="append").wait().report()
    rows = sensor.to_arrow()
    assert rows.num_rows == existing.num_rows + source.num_rows
    overlap = next(c for c in report["checks"] if c["name"] == "no_overlap_with_main")
    assert not overlap["passed"] and not overlap["blocking"]
    assert "48 staged key(s) already exist on main" in overlap["detail"]


def test_same_backfill_twice_changes_nothing_the_second_time(sensor, readings):
    source = readings(recent(5), days=2, devices=3)
    sensor.backfill(source=source).wait()
    snapshot = sensor.refresh().iceberg.current_snapshot().snapshot_id
    second = sensor.backfill(source=source).wait().report()
    assert sensor.refresh().iceberg.current_snapshot().snapshot_id == snapshot
    assert second["rows_written"] == 0 and second["rows_conflicting_existing"] == source.num_rows
    assert sensor.to_arrow().num_rows == source.num_rows


def test_dry_run_reports_and_changes_nothing(sensor, readings, lake):
    existing = readings(recent(10), days=2, devices=2)
    sensor.append(existing)
    before = sensor.refresh().iceberg.metadata
    source = readings(recent(12), days=6, devices=2)
    gap = pc.filter(source, pc.not_equal(pc.cast(pc.floor_temporal(source.column("ts"), unit="day"), pa.date32()),
                                         pa.scalar(pc.strptime(recent(11), "%Y-%m-%d", "s").as_py().date())))
    job = sensor.backfill(source=gap, dry_run=True).wait()
    report = job.report()
    after = sensor.refresh().iceberg.metadata
    assert after.snapshots == before.snapshots and after.refs == before.refs
    assert report["phase"] == "dry_run_complete"
    assert report["rows_in_source"] == gap.num_rows
    assert report["overlap_existing_rows"] == existing.num_rows
    assert report["source_gaps"] == [{"start": recent(11), "end": recent(11), "days": 1}]
    assert report["units"] == 5 and report["files"] == 0
    assert report["estimated_cost"]["aws_usd"] > 0 and "assumptions" in report["estimated_cost"]
    assert lake.runtime.store.leases() == []
    scratch = Path(lake.runtime.config.staging.removeprefix("file://"), job.id)  # all that is left: the predicted diff
    assert sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*")) == ["diff", "diff/job.json", "diff/job.parquet"]


def test_publish_by_day_commits_one_chunk_per_day(sensor, readings):
    source = readings(recent(6), days=3, devices=2)
    report = sensor.backfill(source=source, publish_by="day").wait().report()
    assert len(report["published_snapshot_ids"]) == 3
    assert len(report["published_chunks"]) == 3
    main = sensor.refresh().iceberg
    history = [main.current_snapshot()]
    while history[-1].parent_snapshot_id is not None:
        history.append(main.snapshot_by_id(history[-1].parent_snapshot_id))
    assert sorted(s.snapshot_id for s in history) == sorted(report["published_snapshot_ids"])  # nothing but the chunks
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(source))
    assert duplicate_keys(sensor.to_arrow()) == 0


def test_retention_rejects_old_rows_unless_overridden(sensor, readings):
    old = readings("2020-01-01", days=1, devices=1)
    fresh = readings(recent(3), days=1, devices=1)
    report = sensor.backfill(source=pa.concat_tables([old, fresh])).wait().report()
    assert report["rows_outside_retention"] == old.num_rows
    assert sensor.to_arrow().num_rows == fresh.num_rows
    report = sensor.backfill(source=old, override_retention=True).wait().report()
    assert report["rows_written"] == old.num_rows
    assert sensor.to_arrow().num_rows == old.num_rows + fresh.num_rows


@pytest.mark.parametrize("max_concurrency", [1, 2])
def test_files_are_sorted_one_per_unit_with_field_ids(sensor, readings, max_concurrency):
    source = readings(recent(4), days=2, devices=5, step_minutes=1)  # 14,400 rows
    report = sensor.backfill(source=source, max_concurrency=max_concurrency).wait().report()
    files = sensor.refresh().iceberg.inspect.files()
    assert files.num_rows == report["files"] == report["units"] == 2
    import pyarrow.parquet as pq

    for path in files.column("file_path").to_pylist():
        data = pq.read_table(path.removeprefix("file://"))
        assert data.equals(data.sort_by([("device_id", "ascending"), ("ts", "ascending")]))
        assert pq.read_schema(path.removeprefix("file://")).field("ts").metadata[b"PARQUET:field_id"] == b"1"


def test_large_partitions_split_into_series_slices_of_target_size(lake, readings):
    table = lake.create_table("iot.small_files", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", target_file_size="16KB")
    source = readings(recent(3), days=1, devices=12, step_minutes=1)  # 17,280 rows in one day partition
    report = table.backfill(source=source).wait().report()
    assert report["units"] == report["files"] > 2
    files = table.refresh().iceberg.inspect.files()
    sizes = files.column("file_size_in_bytes").to_pylist()
    assert max(sizes) < 1.2 * min(sizes), sizes  # slices are balanced by rows per series bucket
    devices_per_file = []
    import pyarrow.parquet as pq

    for path in files.column("file_path").to_pylist():
        devices_per_file.append(set(pq.read_table(path.removeprefix("file://"), columns=["device_id"]).column(0).to_pylist()))
    assert sum(len(d) for d in devices_per_file) == 12  # each series lives in exactly one file of the partition
    assert sort_rows(table.to_arrow()).equals(sort_rows(source))


def _commit_after_the_first_unit(monkeypatch, sensor, live: pa.Table) -> list[str]:
    """Live ingestion commits ``live`` right after the job's first unit is written; every other unit
    waits for that commit. Returns the ids of the units in the order they started."""
    import threading

    import timelake.runner as runner

    started, committed, gate, real_write = [], threading.Event(), threading.Lock(), runner.write_unit

    def write_then_commit(rt, job_id, unit_id, *args):
        with gate:
            is_first = not started
            started.append(unit_id)
        if is_first:
            result = real_write(rt, job_id, unit_id, *args)
            sensor.append(live)
            committed.set()
            return result
        assert committed.wait(30)
        return real_write(rt, job_id, unit_id, *args)
    monkeypatch.setattr(runner, "write_unit", write_then_commit)
    return started


def _live_rows(source: pa.Table, day: str, rows: int = 12) -> pa.Table:
    """``rows`` of the source's keys from ``day`` on, with values no source row has."""
    from datetime import datetime

    since = pa.scalar(datetime.fromisoformat(day).replace(tzinfo=UTC), pa.timestamp("us", tz="UTC"))
    live = source.filter(pc.greater_equal(source.column("ts"), since)).slice(0, rows)
    return live.set_column(2, "value", pa.array([-1.0] * rows))


@pytest.mark.parametrize("max_concurrency", [1, 2], ids=["inline", "threads"])
def test_merge_units_see_a_live_commit_made_while_the_job_writes(sensor, readings, monkeypatch, max_concurrency):
    """The writers of one process share one plan of main; a live commit between units moves main, and
    the units written after it must drop the live keys themselves (not leave them to publish)."""
    existing = readings(recent(10), days=1, devices=3, seed=1)
    sensor.append(existing)
    source = readings(recent(10), days=4, devices=3, seed=2)
    live = _live_rows(source, recent(7))
    started = _commit_after_the_first_unit(monkeypatch, sensor, live)
    job = sensor.backfill(source=source, mode="merge", max_concurrency=max_concurrency).wait()
    report = job.report()
    last = max(sensor.lake.runtime.store.units(job.id), key=lambda u: u.info["start"])
    assert started[0] != last.unit_id
    assert last.result["rows_conflicting_existing"] == 12
    assert report["rows_conflicting_at_publish"] == 0
    assert sort_rows(sensor.to_arrow()).equals(reference_merge(pa.concat_tables([existing, live]), source))


def test_merge_into_a_table_empty_at_the_plan_lets_live_rows_win(sensor, readings, monkeypatch):
    """Main was empty when the job planned, so nothing was on main "at the base"; live rows committed
    after the plan that the already written first unit also holds are live overlap (they win at
    publish), never a blocking overlap with main."""
    source = readings(recent(10), days=3, devices=3, seed=2)
    live = _live_rows(source, recent(10))
    started = _commit_after_the_first_unit(monkeypatch, sensor, live)
    job = sensor.backfill(source=source, mode="merge", max_concurrency=1).wait()
    report = job.report()
    first = min(sensor.lake.runtime.store.units(job.id), key=lambda u: u.info["start"])
    assert started[0] == first.unit_id and first.result["rows_conflicting_existing"] == 0
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["no_overlap_with_main"]["passed"], checks["no_overlap_with_main"]["detail"]
    assert not checks["live_overlap_since_plan"]["passed"] and "12 staged key(s)" in checks["live_overlap_since_plan"]["detail"]
    assert report["phase"] == "published" and report["rows_conflicting_at_publish"] == 12
    assert sort_rows(sensor.to_arrow()).equals(reference_merge(live, source))


@pytest.mark.parametrize("publish_by", [None, "day"], ids=["one_commit", "publish_by_day"])
def test_replace_keeps_the_rows_live_ingestion_commits_in_the_range_while_the_job_runs(sensor, readings, monkeypatch, publish_by):
    """Replace deletes the range as main held it at the plan. Rows live writers commit in the range
    afterwards are not the job's to delete: they survive, and where the source has the same key the
    live row wins, as in merge mode."""
    existing, source = _existing_and_source(sensor, readings)
    start, end = recent(9), recent(7)
    in_range = source.filter(pc.and_(pc.greater_equal(source.column("ts"), _day(start)), pc.less(source.column("ts"), _day(end))))
    colliding = in_range.slice(0, 6).set_column(2, "value", pa.array([-1.0] * 6))
    beside = readings(recent(8), days=1, devices=1, step_minutes=60, seed=5)  # a device the source lacks
    beside = beside.set_column(1, "device_id", pa.array(["late"] * beside.num_rows))
    outside = readings(recent(3), days=1, devices=1, seed=6)  # after the range: never touched
    live = pa.concat_tables([colliding, beside, outside])
    _commit_after_the_first_unit(monkeypatch, sensor, live)
    report = sensor.backfill(source=source, mode="replace", start=start, end=end, publish_by=publish_by).wait().report()
    expected = _replace_reference(existing, live, source, start, end)
    assert sort_rows(sensor.to_arrow()).equals(expected)
    assert report["phase"] == "published" and report["rows_conflicting_at_publish"] == 6
    assert report["rows_written"] == expected.num_rows - existing.num_rows - live.num_rows + pc.sum(pc.and_(
        pc.greater_equal(existing.column("ts"), _day(start)), pc.less(existing.column("ts"), _day(end))).cast(pa.int64())).as_py()


def _day(day: str) -> pa.Scalar:
    from datetime import datetime

    return pa.scalar(datetime.fromisoformat(day).replace(tzinfo=UTC), SCHEMA.field("ts").type)


def test_replace_that_loses_a_commit_race_keeps_the_live_rows_of_both_attempts(sensor, readings, monkeypatch):
    """A live commit lands between publish's look at main and its commit: the commit fails, publish
    reads main again and retries, and the rows of the first live commit (already rewritten by the
    first attempt) and of the racing one both survive the range delete."""
    import timelake.steps.publish as publish

    existing, source = _existing_and_source(sensor, readings)
    start, end = recent(9), recent(7)

    def late(seed: int, device: str) -> pa.Table:
        rows = readings(recent(8), days=1, devices=1, step_minutes=120, seed=seed)
        return rows.set_column(1, "device_id", pa.array([device] * rows.num_rows))
    first, racing = late(7, "late-a"), late(8, "late-b")
    _commit_after_the_first_unit(monkeypatch, sensor, first)
    attempts, real = [], publish.without_blind_retries

    def race(table):
        attempts.append(table.metadata_location)
        if len(attempts) == 1:
            sensor.append(racing)  # main moves after publish read it: this attempt's commit must fail
        return real(table)
    monkeypatch.setattr(publish, "without_blind_retries", race)
    report = sensor.backfill(source=source, mode="replace", start=start, end=end).wait().report()
    assert len(attempts) == 2 and attempts[0] != attempts[1]
    rows = sensor.to_arrow()
    for live in (first, racing):
        device = live.column("device_id")[0].as_py()
        kept = rows.filter(pc.equal(rows.column("device_id"), device))
        assert sort_rows(kept).equals(sort_rows(live)), f"the rows of {device} did not survive the replace"
    assert report["phase"] == "published" and duplicate_keys(rows) == 0


def test_replace_that_loses_every_commit_race_fails_resumable_and_loses_nothing(sensor, readings, monkeypatch):
    """A live writer faster than the replace commit wins every attempt: the job fails in publishing
    with an error naming the conflicts, main has none of the job's rows and every live row; resume,
    once the writer is quiet, publishes the exact result."""
    import timelake.steps.publish as publish
    from timelake.errors import BackfillError

    existing, source = _existing_and_source(sensor, readings)
    start, end = recent(9), recent(7)
    commits, real = [], publish.without_blind_retries

    def always_beaten(table):
        rows = readings(recent(8), days=1 / 24, devices=1, step_minutes=10, seed=len(commits))
        rows = rows.set_column(1, "device_id", pa.array([f"live-{len(commits)}"] * rows.num_rows))
        commits.append(rows)
        sensor.append(rows)
        return real(table)
    monkeypatch.setattr(publish, "without_blind_retries", always_beaten)
    monkeypatch.setattr(publish, "PUBLISH_ATTEMPTS", 3)
    job = sensor.backfill(source=source, mode="replace", start=start, end=end)
    with pytest.raises(BackfillError, match="kept conflicting with other commits"):
        job.wait()
    record = job.record()
    assert record.phase == "failed" and record.state["failed_phase"] == "publishing" and len(commits) == 3
    live = pa.concat_tables(commits)
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(pa.concat_tables([existing, live])))

    monkeypatch.setattr(publish, "without_blind_retries", real)
    report = job.resume(wait=True).report()
    expected = _replace_reference(existing, live, source, start, end)
    assert report["phase"] == "published" and sort_rows(sensor.to_arrow()).equals(expected)


def _replace_reference(existing: pa.Table, live: pa.Table, source: pa.Table, start: str, end: str) -> pa.Table:
    """Replace under live ingestion, computed independently: main outside [start, end), every live
    row, and the last source row of each key in the range that no live row holds."""
    con = duckdb.connect()
    con.register("existing", existing)
    con.register("live", live)
    con.register("source", source.append_column("__pos", pa.array(range(source.num_rows))))
    return con.sql(f"""
        SELECT ts, device_id, value FROM existing WHERE NOT (ts >= '{start}'::TIMESTAMPTZ AND ts < '{end}'::TIMESTAMPTZ)
        UNION ALL SELECT ts, device_id, value FROM live
        UNION ALL
        SELECT ts, device_id, value FROM (
            SELECT * FROM (
                SELECT *, row_number() OVER (PARTITION BY device_id, ts ORDER BY __pos DESC) AS r FROM source
                WHERE ts >= '{start}'::TIMESTAMPTZ AND ts < '{end}'::TIMESTAMPTZ) WHERE r = 1
        ) ANTI JOIN live USING (device_id, ts)
        ORDER BY device_id, ts""").to_arrow_table().cast(SCHEMA)


@pytest.mark.parametrize("keys", [{"series_key": ["device_id", "site"]},
                                  {"series_key": ["device_id"], "dedup_key": ["device_id", "ts", "site"]}])
def test_merge_with_a_key_of_three_columns_checks_overlap_with_main(lake, readings, keys):
    """A key that does not pack into one integer (two series columns, or a dedup key wider than series
    and time) takes the other overlap check of validation, which matches each staged batch against
    main's rows of its partition."""
    def with_site(rows: pa.Table) -> pa.Table:
        site = pc.if_else(pc.equal(rows.column("device_id"), "d01"), "north", "south")
        return rows.append_column("site", site)

    existing = with_site(readings(recent(10), days=3, devices=3, seed=1))
    table = lake.create_table("iot.sites", schema=existing.schema, time_column="ts", partition_by="day", retention="P3Y", **keys)
    table.append(existing)
    source = with_site(readings(recent(9), days=4, devices=4, seed=2))
    report = table.backfill(source=source, mode="merge").wait().report()
    assert report["phase"] == "published" and all(c["passed"] for c in report["checks"]), report["checks"]
    con = duckdb.connect()
    con.register("existing", existing)
    con.register("source", source)
    expected = con.sql("""SELECT * FROM existing UNION ALL SELECT * FROM source ANTI JOIN existing USING (device_id, site, ts)
                          ORDER BY device_id, site, ts""").to_arrow_table()
    got = table.to_arrow().sort_by([("device_id", "ascending"), ("site", "ascending"), ("ts", "ascending")])
    assert got.select(expected.column_names).cast(expected.schema).equals(expected)
    overlap = con.sql("SELECT count(*) FROM source SEMI JOIN existing USING (device_id, site, ts)").fetchall()[0][0]
    assert report["rows_conflicting_existing"] == overlap > 0
