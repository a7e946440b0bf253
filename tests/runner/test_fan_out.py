"""Where a job's writers run: two writers are threads of the job's own process whatever the rows (two
threads keep two cores busy and a process pool only adds its start); more writers on a job above the
row limit are worker processes. Either way the table ends the same."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import timelake
import timelake.runner as runner
from tests.conftest import SCHEMA, make_readings, recent, reference_merge, sort_rows


@pytest.mark.parametrize(("writers", "in_job_process"), [(2, True), (3, False)])
def test_writers_above_the_row_limit_are_threads_up_to_two(tmp_path, monkeypatch, writers: int,
                                                           in_job_process: bool) -> None:
    monkeypatch.setenv("TIMELAKE_IN_PROCESS_ROWS", "0")  # every job is above the row limit
    ran: list[tuple[int, str]] = []
    write = runner.write_unit

    def recorded(*args, **kwargs):  # a worker process imports the runner afresh and records nothing here
        ran.append((os.getpid(), threading.current_thread().name))
        return write(*args, **kwargs)

    monkeypatch.setattr(runner, "write_unit", recorded)
    lake = timelake.connect(warehouse=tmp_path / "lake")
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", retention="P3Y")
    source = make_readings(recent(6), days=4, devices=3)
    job = table.backfill(source=source, max_concurrency=writers).wait()
    written = [u for u in lake.runtime.store.units(job.id) if not u.info.get("direct")]
    assert job.record().phase == "published" and len(written) >= 4
    if in_job_process:
        assert len(ran) == len(written) and {pid for pid, _ in ran} == {os.getpid()}
        assert all(name.startswith("timelake-write") for _, name in ran)
    else:
        assert ran == []
    main = sort_rows(table.refresh().iceberg.scan().to_arrow())
    assert main.equals(sort_rows(reference_merge(SCHEMA.empty_table(), source)))


def test_the_checks_progress_counts_every_staged_file_once(tmp_path) -> None:
    """The checks' progress notes are written once the items after them have started (a note is a store
    write the next check would otherwise wait for): the last ones still count when the fan-out ends."""
    lake = timelake.connect(warehouse=tmp_path / "lake")
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", retention="P3Y")
    job = table.backfill(source=make_readings(recent(6), days=5, devices=3), max_concurrency=2).wait()
    staged = len([u for u in lake.runtime.store.units(job.id) if u.result.get("path")])
    assert job.record().phase == "published" and staged >= 5
    assert lake.runtime.store.progress_notes(job.id)["validate"] == {"done": staged, "total": staged, "of": "files"}


def _counted_checks(monkeypatch, fail_first_early: list[str] | None = None) -> list[tuple[str, str]]:
    """Every per-file check a job runs, as (file, thread name). With ``fail_first_early``, the first check
    beside the stage commit raises, as a check of a file lost meanwhile would, and its file is put there."""
    calls: list[tuple[str, str]] = []
    lock = threading.Lock()
    check = runner.check_file

    def counted(rt, job_id, file, *args, **kwargs):
        name = threading.current_thread().name
        with lock:
            calls.append((file, name))
            fails = fail_first_early is not None and not fail_first_early and name.startswith("timelake-early-check")
            if fails:
                fail_first_early.append(file)
        if fails:
            raise OSError(f"{file} could not be read")
        return check(rt, job_id, file, *args, **kwargs)

    monkeypatch.setattr(runner, "check_file", counted)
    return calls


def _sensor(tmp_path):
    lake = timelake.connect(warehouse=tmp_path / "lake")
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", retention="P3Y")
    return lake, table


def test_the_checks_run_beside_the_stage_commit_and_no_file_is_checked_twice(tmp_path, monkeypatch) -> None:
    """Validation's per-file checks read the written files while stage commits them to the branch; the
    validate step finds their facts under the snapshots it fixes and checks nothing again."""
    lake, table = _sensor(tmp_path)
    table.append(make_readings(recent(6), days=5, devices=1, step_minutes=240, seed=3))  # main is not empty
    calls = _counted_checks(monkeypatch)
    job = table.backfill(source=make_readings(recent(6), days=5, devices=3), max_concurrency=2).wait()
    record = job.record()
    staged = sorted(u.result["path"] for u in lake.runtime.store.units(job.id) if u.result.get("path"))
    assert record.phase == "published" and len(staged) >= 5
    assert sorted(file for file, _ in calls) == staged
    assert {name.rsplit("_", 1)[0] for _, name in calls} == {"timelake-early-check"}
    assert all(c["passed"] for c in record.state["checks"])
    assert lake.runtime.store.progress_notes(job.id)["validate"] == {"done": len(staged), "total": len(staged), "of": "files"}


def test_a_live_commit_during_the_stage_commit_has_every_file_checked_again(tmp_path, monkeypatch) -> None:
    """Facts taken against main before a live writer committed are not reused: validation checks every
    file again against the new snapshot and reports the key the live writer took, which wins at publish."""
    from timelake.model import faults

    lake, table = _sensor(tmp_path)
    source = make_readings(recent(6), days=5, devices=3)
    table.append(make_readings(recent(40), days=1, devices=1))  # main holds rows outside the range
    live = source.slice(7, 1).set_column(2, "value", pa.array([-1.0]))
    calls = _counted_checks(monkeypatch)
    with faults.at("stage.committed", lambda: table.append(live)):
        job = table.backfill(source=source, max_concurrency=2).wait()
    record = job.record()
    staged = sorted(u.result["path"] for u in lake.runtime.store.units(job.id) if u.result.get("path"))
    assert record.phase == "published"
    assert sorted(file for file, name in calls if not name.startswith("timelake-early-check")) == staged
    checks = {c["name"]: c for c in record.state["checks"]}
    assert checks["live_overlap_since_plan"]["detail"].startswith("1 staged key(s)")
    kept = table.refresh().iceberg.scan().to_arrow()
    at = pc.and_(pc.equal(kept["device_id"], live["device_id"][0]), pc.equal(kept["ts"], live["ts"][0]))
    assert kept.filter(at)["value"].to_pylist() == [-1.0]


def test_an_early_check_that_fails_is_left_to_validation(tmp_path, monkeypatch) -> None:
    """A check beside the stage commit that fails (a file it could not read) fails nothing: the validate
    step checks that file itself, and the others not again."""
    lake, table = _sensor(tmp_path)
    unreadable: list[str] = []
    calls = _counted_checks(monkeypatch, fail_first_early=unreadable)
    job = table.backfill(source=make_readings(recent(6), days=5, devices=3), max_concurrency=2).wait()
    assert job.record().phase == "published" and all(c["passed"] for c in job.record().state["checks"])
    (failed,) = unreadable
    assert [name.rsplit("_", 1)[0] for file, name in calls if file == failed] == ["timelake-early-check", "timelake-check"]
    assert {name.rsplit("_", 1)[0] for file, name in calls if file != failed} == {"timelake-early-check"}
