"""A partition whose rows all lie in one scan task's files is written by that task, with no spill and no
write step: the table ends exactly as through the spill, and whatever the plan cannot prove exclusive
(a day split over two tasks, a file over several days, a text time column) goes through the spill."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import timelake.steps.plan
import timelake.steps.scan
from tests.conftest import SCHEMA, make_readings, recent, reference_merge, sort_rows
from timelake.model.spec import JobSpec
from timelake.steps.abort import abort
from timelake.steps.plan import cut, pending_pieces, plan, scan
from timelake.steps.scan import read_result


def _day_files(folder: Path, days: int, start: int = 6) -> pa.Table:
    """A Parquet file per day (four devices, every 30 minutes), each with two corrections of earlier
    rows of its day at its end (later rows win); all the rows, in file order."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for day in range(days):
        rows = make_readings(recent(start - day), days=1, devices=4, step_minutes=30, seed=day)
        fixes = rows.slice(5, 2).set_column(2, "value", pa.array([-1.0 - day, -2.0 - day]))
        part = pa.concat_tables([rows, fixes])
        pq.write_table(part, folder / f"day-{day:02d}.parquet")
        parts.append(part)
    return pa.concat_tables(parts)


def _main(lake) -> pa.Table:
    return sort_rows(lake.table("iot.sensor").refresh().iceberg.scan().to_arrow())


def _direct_units(lake, job_id: str) -> list[str]:
    return sorted(u.unit_id for u in lake.runtime.store.units(job_id) if u.info.get("direct"))


def test_day_files_are_written_by_their_scan_tasks_and_end_as_through_the_spill(sensor, lake, tmp_path):
    source = _day_files(tmp_path / "export", days=4)
    job = sensor.backfill(source=str(tmp_path / "export" / "*.parquet"), max_concurrency=2).wait()
    record = job.record()
    assert record.phase == "published" and record.state["direct_partitions"] == 4
    assert len(_direct_units(lake, job.id)) == 4 == record.state["units_total"]
    assert all(u.result["spill_bytes_read"] == 0 for u in lake.runtime.store.units(job.id))
    assert _main(lake).equals(sort_rows(reference_merge(SCHEMA.empty_table(), source)))
    report = job.report()
    assert report["rows_duplicate_in_source"] == 8 and all(c["passed"] for c in report["checks"])

    # the same rows from memory take the spill: the same table
    other = timelake_lake(tmp_path / "other")
    other.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day",
                       retention="P3Y", target_file_size="64MB").backfill(source=source).wait()
    assert _main(other).equals(_main(lake))


def timelake_lake(warehouse: Path):
    import timelake

    return timelake.connect(warehouse=warehouse)


def test_a_day_split_over_two_tasks_and_a_file_over_two_days_go_through_the_spill(sensor, lake, tmp_path, monkeypatch):
    monkeypatch.setattr(timelake.steps.plan, "MIN_TASK_BYTES", 1)  # a task per file
    source = _day_files(tmp_path / "export", days=4)
    late = make_readings(recent(5), days=1, devices=2, step_minutes=60, seed=9, value_offset=100)  # day 1 again
    wide = make_readings(recent(4), days=2, devices=1, step_minutes=120, seed=8, value_offset=200)  # days 2 and 3
    pq.write_table(late, tmp_path / "export" / "z-late.parquet")
    pq.write_table(wide, tmp_path / "export" / "z-wide.parquet")
    job = sensor.backfill(source=str(tmp_path / "export" / "*.parquet"), max_concurrency=2).wait()
    assert job.record().phase == "published"
    direct = _direct_units(lake, job.id)
    assert len(direct) == 1 and direct[0].startswith(f"day-{_day_number(recent(6))}-"), direct
    expected = reference_merge(SCHEMA.empty_table(), pa.concat_tables([source, late, wide]))
    assert _main(lake).equals(sort_rows(expected))


def _day_number(day: str) -> int:
    return int(pc.cast(pa.scalar(f"{day}T00:00:00+00:00").cast(pa.timestamp("us", "UTC")), pa.int64()).as_py()
               // 86_400_000_000)


def test_a_task_holding_too_many_rows_spills_its_largest_partition(sensor, lake, tmp_path, monkeypatch):
    """Files of two days interleaved in one task: both days are the task's alone, so it holds both until
    their last file; past its budget it spills the larger one, and the table ends the same."""
    monkeypatch.setattr(timelake.steps.scan, "DIRECT_MAX_ROWS", 300)
    folder = tmp_path / "export"
    folder.mkdir()
    parts = []
    for i, (day, devices) in enumerate([(6, 3), (5, 2), (6, 2), (5, 1)]):  # day 6, day 5, day 6, day 5
        part = make_readings(recent(day), days=1, devices=devices, step_minutes=30, seed=i, value_offset=10 * i)
        part = part.set_column(1, "device_id", pc.binary_join_element_wise(part.column("device_id"), f"-{i}", ""))
        pq.write_table(part, folder / f"{i:02d}.parquet")
        parts.append(part)
    job = sensor.backfill(source=str(folder / "*.parquet")).wait()
    assert job.record().state["direct_partitions"] == 2
    assert _direct_units(lake, job.id) == [f"day-{_day_number(recent(5))}-s0-0of1"]  # day 6 held more: spilled
    assert _main(lake).equals(sort_rows(reference_merge(SCHEMA.empty_table(), pa.concat_tables(parts))))


def test_text_times_are_never_written_by_the_scan(sensor, lake, tmp_path):
    """A time column of text may carry a different offset on every row: its footer bounds prove nothing."""
    source = _day_files(tmp_path / "export", days=2)
    for path in sorted((tmp_path / "export").glob("*.parquet")):
        rows = pq.read_table(path)
        pq.write_table(rows.set_column(0, "ts", pc.strftime(rows.column("ts"), "%Y-%m-%dT%H:%M:%S+00:00")), path)
    job = sensor.backfill(source=str(tmp_path / "export" / "*.parquet")).wait()
    assert job.record().state["direct_partitions"] == 0 and not _direct_units(lake, job.id)
    assert _main(lake).equals(sort_rows(reference_merge(SCHEMA.empty_table(), source)))


def test_merge_drops_the_keys_main_holds_in_a_day_the_scan_writes(sensor, lake, tmp_path):
    source = _day_files(tmp_path / "export", days=3)
    existing = make_readings(recent(5), days=1, devices=2, step_minutes=60, seed=3, value_offset=1_000)
    sensor.append(existing)
    job = sensor.backfill(source=str(tmp_path / "export" / "*.parquet")).wait()
    assert len(_direct_units(lake, job.id)) == 3
    report = job.report()
    assert report["rows_conflicting_existing"] == existing.num_rows and all(c["passed"] for c in report["checks"])
    assert _main(lake).equals(sort_rows(reference_merge(existing, source)))


def test_abort_after_the_scan_deletes_the_files_the_scan_wrote(sensor, lake, tmp_path):
    _day_files(tmp_path / "export", days=3)
    rt = lake.runtime
    job = lake.create_job(JobSpec(table="iot.sensor", source=str(tmp_path / "export" / "*.parquet")))
    plan(rt, job.id)
    for task in pending_pieces(rt, job.id):
        scan(rt, job.id, task)
    written = [p.direct["path"] for t in range(len(rt.store.get_job(job.id).state["scan_tasks"]))
               for p in read_result(rt, job.id, t).partitions.values() if p.direct]
    written = [Path(p.removeprefix("file://")) for p in written]
    assert len(written) == 3 and all(p.exists() for p in written)
    abort(rt, job.id)
    assert not any(p.exists() for p in written)


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "canary"])
def test_a_dry_run_or_a_canary_writes_nothing_in_the_scan(sensor, lake, warehouse, tmp_path, dry_run):
    _day_files(tmp_path / "export", days=2)
    rt = lake.runtime
    options = {"dry_run": True} if dry_run else {"canary": True}
    job = lake.create_job(JobSpec(table="iot.sensor", source=str(tmp_path / "export" / "*.parquet"), **options))
    plan(rt, job.id)
    for task in pending_pieces(rt, job.id):
        scan(rt, job.id, task)
    cut(rt, job.id)
    assert rt.store.get_job(job.id).state["direct_partitions"] == 0
    assert not _direct_units(lake, job.id) and not list(warehouse.rglob(f"{job.id}-*.parquet"))
