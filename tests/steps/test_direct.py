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
from tests.steps.test_diff import assert_cells, reference
from timelake.model import faults
from timelake.model.layout import read_range
from timelake.model.spec import JobSpec
from timelake.model.timeutil import parse_instant, to_micros
from timelake.steps.abort import abort
from timelake.steps import diff as diff_step
from timelake.steps.plan import cut, pending_pieces, plan, scan
from timelake.steps.scan import read_result


def _day_files(folder: Path, days: int, start: int = 6, step_minutes: int = 30) -> pa.Table:
    """A Parquet file per day (four devices, one after the other, every 30 minutes), each with two
    corrections of earlier rows of its day at its end (later rows win); all the rows, in file order."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for day in range(days):
        rows = make_readings(recent(start - day), days=1, devices=4, step_minutes=step_minutes, seed=day)
        fixes = rows.slice(5, 2).set_column(2, "value", pa.array([-1.0 - day, -2.0 - day]))
        part = pa.concat_tables([rows, fixes])
        pq.write_table(part, folder / f"day-{day:02d}.parquet")
        parts.append(part)
    return pa.concat_tables(parts)


def _main(lake) -> pa.Table:
    return sort_rows(lake.table("iot.sensor").refresh().iceberg.scan().to_arrow())


def _direct_units(lake, job_id: str) -> list[str]:
    return sorted(u.unit_id for u in lake.runtime.store.units(job_id) if u.info.get("direct"))


@pytest.mark.parametrize("step_minutes", [30, 1])
def test_day_files_are_written_by_their_scan_tasks_and_end_as_through_the_spill(sensor, lake, tmp_path, monkeypatch, step_minutes):
    """Every 30 minutes a day's rows are cut row by row; every minute, a device's rows of a day make a run
    long enough to be cut a run at a time (`scan._scan_batch`), and the task holds them row by row all
    the same."""
    counted = timelake.steps.scan._partition_counts
    per_run: list[bool] = []
    monkeypatch.setattr(timelake.steps.scan, "_partition_counts", lambda *args: per_run.append(args[-1] is not None) or counted(*args))
    source = _day_files(tmp_path / "export", days=4, step_minutes=step_minutes)
    job = sensor.backfill(source=str(tmp_path / "export" / "*.parquet"), max_concurrency=2).wait()
    assert per_run and all(per_run) == (step_minutes == 1)
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


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_merge_jobs_scan_tasks_on_one_process_plan_main_once(sensor, lake, tmp_path, monkeypatch, concurrency):
    """Scan tasks one after another or two at a time on threads of one process, each writing its days over main's rows:
    main is planned once for all of them, over the days the job's scan tasks write (``direct_span``),
    and each drops the keys main holds in its own days."""
    from timelake.model import layout

    monkeypatch.setattr(timelake.steps.plan, "MIN_TASK_BYTES", 1)
    source = _day_files(tmp_path / "export", days=4)
    existing = make_readings(recent(6), days=3, devices=2, step_minutes=60, seed=3, value_offset=1_000)
    sensor.append(existing)
    spans = []

    class Counted(layout.SnapshotRange):
        def __init__(self, table, column, start_us, end_us, *args, **kwargs) -> None:
            spans.append([start_us, end_us])
            super().__init__(table, column, start_us, end_us, *args, **kwargs)

    monkeypatch.setattr(layout, "SnapshotRange", Counted)
    job = sensor.backfill(source=str(tmp_path / "export" / "*.parquet"), max_concurrency=concurrency).wait()
    state = job.record().state
    assert len(state["scan_tasks"]) >= 2 and state["direct_partitions"] == 4
    assert spans == [state["direct_span"]] == [[to_micros(parse_instant(recent(6))), to_micros(parse_instant(recent(2)))]]
    assert job.report()["rows_conflicting_existing"] == existing.num_rows
    assert _main(lake).equals(sort_rows(reference_merge(existing, source)))


def _merge_diff_scene(sensor, tmp_path: Path) -> tuple[Path, pa.Table]:
    """Three day files, and main holding other values of two devices on two of those days and a day before."""
    _day_files(tmp_path / "export", days=3)
    existing = pa.concat_tables([make_readings(recent(5), days=2, devices=2, step_minutes=60, seed=3, value_offset=1_000),
                                 make_readings(recent(7), days=1, devices=1, step_minutes=60, seed=4)])
    sensor.append(existing)
    return tmp_path / "export" / "*.parquet", existing


def _diff_against_main(sensor, job, start: str, end: str, before_snapshot: int) -> None:
    """The job's diff cell by cell against DuckDB's join of main's range before (the job's plan) and after."""
    after = sensor.refresh().iceberg.current_snapshot().snapshot_id
    rows = lambda snapshot: read_range(sensor.iceberg, "ts", to_micros(parse_instant(start)), to_micros(parse_instant(end)),  # noqa: E731
                                       snapshot_id=snapshot)
    found = job.diff()
    assert_cells(found["cells"], reference(rows(before_snapshot), rows(after), ["device_id", "ts"], ["device_id"], ["value"]))
    assert found["totals"]["in_both"] == found["totals"]["rows_before"] > 0 and found["totals"]["changed"] == 0


def test_a_merge_unit_the_scan_writes_counts_mains_rows_for_the_diff_without_a_main_task(sensor, lake, tmp_path,
                                                                                            monkeypatch):
    """The rows a day's scan task reads from main to drop its keys are the diff's "before" of that day: no
    main task reads them again, and the diff is what main shows (and what the dry run predicted, which
    reads them through main tasks)."""
    source, existing = _merge_diff_scene(sensor, tmp_path)
    start, end = recent(7), recent(2)
    predicted = sensor.backfill(source=str(source), start=start, end=end, dry_run=True).wait().diff()
    before = sensor.refresh().iceberg.current_snapshot().snapshot_id
    read_by_main_tasks = []
    real = diff_step.read_main
    monkeypatch.setattr(diff_step, "read_main", lambda *a: read_by_main_tasks.append(real(*a)) or read_by_main_tasks[-1])
    job = sensor.backfill(source=str(source), start=start, end=end).wait()
    units = lake.runtime.store.units(job.id)
    direct = [u for u in units if u.info.get("direct")]
    assert len(direct) == 3 and all(u.info.get("main_counted") for u in direct)
    # day -7 holds main's rows but no source rows: the main tasks read those, and only those
    day_7 = pc.sum(pc.equal(pc.strftime(existing.column("ts"), "%Y-%m-%d"), recent(7))).as_py()
    assert sum(r["rows"] for r in read_by_main_tasks) == day_7 == 24
    _diff_against_main(sensor, job, start, end, before)
    assert job.diff()["cells"].equals(predicted["cells"])


def test_a_merge_whose_scan_wrote_every_day_of_its_range_lists_no_main_files_for_main_tasks(sensor, lake, tmp_path,
                                                                                               monkeypatch):
    """Every day of the job's range written by its scan task, which counted main's rows there: the cut
    has no main task to make and does not plan main's files for one; the diff is what main shows."""
    source, _ = _merge_diff_scene(sensor, tmp_path)
    before = sensor.refresh().iceberg.current_snapshot().snapshot_id
    listed = []
    real = timelake.steps.plan.main_tasks
    monkeypatch.setattr(timelake.steps.plan, "main_tasks", lambda *a, **k: listed.append(a) or real(*a, **k))
    job = sensor.backfill(source=str(source)).wait()
    units = lake.runtime.store.units(job.id)
    assert len(units) == 3 and all(u.info.get("main_counted") for u in units)
    assert listed == [] and job.record().state["diff"]["tasks"] == 0
    _diff_against_main(sensor, job, recent(6), recent(3), before)
    assert job.diff()["totals"]["in_both"] > 0


def test_a_merge_job_scanned_by_an_engine_that_kept_mains_count_apart_takes_it_from_there(sensor, lake, tmp_path):
    """Earlier engines kept a merge unit's count of main's rows in a facts file of its own (``local``): a
    job they scanned, resumed by this engine, finds the count there and its diff is what main shows."""
    from timelake.model.diff import facts_uri, read_facts, write_facts

    source, _ = _merge_diff_scene(sensor, tmp_path)
    start, end = recent(7), recent(2)
    before = sensor.refresh().iceberg.current_snapshot().snapshot_id
    rt, split = lake.runtime, []

    def as_earlier_engines_left_them() -> None:  # after the cut, before the units' facts are read
        job_id = rt.store.list_jobs()[-1].job_id
        for unit in rt.store.units(job_id):
            uri = facts_uri(rt, job_id, "units", unit.unit_id)
            whole, own = read_facts(uri, objects=rt.objects), read_facts(uri, objects=rt.objects, before=False)
            if whole is None or own is None or not whole[2]:
                continue
            write_facts(uri, own[0], own[1], objects=rt.objects)
            write_facts(facts_uri(rt, job_id, "local", unit.unit_id), whole[0].slice(own[0].num_rows), {"only_before": []},
                        objects=rt.objects)
            split.append(unit.unit_id)

    with faults.at("plan.done", as_earlier_engines_left_them):
        job = sensor.backfill(source=str(source), start=start, end=end).wait()
    assert len(split) == 3 and all(u.info.get("main_counted") for u in lake.runtime.store.units(job.id) if u.unit_id in split)
    _diff_against_main(sensor, job, start, end, before)


def test_a_live_commit_between_the_scans_write_and_the_cut_leaves_that_day_to_a_main_task(sensor, lake, tmp_path,
                                                                                           monkeypatch):
    """A unit that read main before another writer committed counted a main the plan no longer shows: the
    cut leaves its day to a main task, which reads main at the plan (the live rows included)."""
    monkeypatch.setattr(timelake.steps.plan, "MIN_TASK_BYTES", 1)  # a task per file, one after another
    source, _ = _merge_diff_scene(sensor, tmp_path)
    start, end = recent(7), recent(2)
    live = pa.concat_tables([make_readings(recent(day), days=1 / 24, devices=1, step_minutes=60, seed=5) for day in (6, 5, 4)])
    live = live.set_column(1, "device_id", pa.array(["live-1"] * 3))  # a row on each day the scan writes
    fired = []

    def commit_once() -> None:
        if not fired:
            fired.append(True)
            sensor.refresh().append(live)

    with faults.at("scan.direct", commit_once):
        job = sensor.backfill(source=str(source), start=start, end=end, max_concurrency=1).wait()
    assert fired and job.record().phase == "published"
    direct = [u for u in lake.runtime.store.units(job.id) if u.info.get("direct")]
    assert len(direct) == 3 and not all(u.info.get("main_counted") for u in direct)
    _diff_against_main(sensor, job, start, end, job.record().state["diff"]["base_snapshot_id"])
    assert "live-1" in job.diff()["cells"].column("series").to_pylist()


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
