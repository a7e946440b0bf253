"""Quiet hours in the embedded runner, on a clock the test controls (`tests.clock.TestClock`): a job plans
at once and waits for its window; when the window closes the running units finish and no new one starts
until it opens; publish waits between its commits; a paused job shows "paused until", stops on Ctrl-C or
an abort, and resumes. The table ends as an independent reference computes it."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import timelake
import timelake.runner as runner
from tests.clock import TestClock
from tests.conftest import SCHEMA, cli, cli_in_process, make_readings, recent, reference_merge, sort_rows
from timelake.errors import Aborted, Interrupted
from timelake.interfaces.console import status_line
from timelake.model import faults
from timelake.model.report import progress_of
from timelake.model.spec import JobSpec
from timelake.steps import diff as diff_step
from timelake.steps import plan as plan_step

BERLIN = "Europe/Berlin"
WINDOW = "22:00-06:00"


def at(local: str) -> float:
    return datetime.fromisoformat(local).replace(tzinfo=ZoneInfo(BERLIN)).timestamp()


def expected(source: pa.Table) -> pa.Table:
    return sort_rows(reference_merge(SCHEMA.empty_table(), source))


@pytest.fixture
def clock(lake: timelake.Lake) -> TestClock:
    lake.runtime.clock = TestClock(at("2030-01-07T05:50"))
    return lake.runtime.clock


def test_a_job_outside_its_window_plans_at_once_and_reads_nothing_until_it_opens(lake, sensor, clock, warehouse):
    clock.advance_to(at("2030-01-07T14:00"))
    source = make_readings(recent(6), days=3, devices=3)
    seen = []

    def paused(until: float) -> None:
        job = lake.runtime.store.get_job(sensor_job.id)
        seen.append((progress_of(lake.runtime.store, sensor_job.id), job.state.get("rows_in_source"),
                     cli("backfill", "status", sensor_job.id, warehouse=warehouse).stdout))

    clock.on_wait.append(paused)
    sensor_job = sensor.backfill(source=source, run_between=WINDOW, tz=BERLIN)
    sensor_job.wait()
    (info, rows_read, printed), = seen
    assert info["phase"] == "scanning" and info["paused_until"] == "2030-01-07T22:00:00+01:00"
    assert rows_read is None  # planned (the plan checked the job), nothing read yet
    assert f"paused until 2030-01-07T22:00:00+01:00 (quiet hours {WINDOW} {BERLIN})" in printed
    assert clock.waits == [(at("2030-01-07T14:00"), at("2030-01-07T22:00"))]
    report = sensor_job.report()
    assert report["phase"] == "published" and report["progress"]["paused_until"] is None
    assert report["quiet_hours"] == {"window": f"{WINDOW} {BERLIN}", "paused_until": None, "pauses": 1,
                                     "paused_seconds": 8 * 3600.0}
    assert sort_rows(sensor.refresh().to_arrow()).equals(expected(source))


def test_the_window_closing_lets_running_units_finish_and_the_rest_wait_for_its_opening(lake, sensor, clock, monkeypatch):
    """Two units run at once: the third closes the window as it ends, while the fourth is being written.
    The fourth ends only after that, so nothing may start between the close and the window's opening."""
    source = make_readings(recent(12), days=8, devices=3)  # eight day units
    started: list[float] = []
    write = runner.write_unit
    close = at("2030-01-07T06:00:30")
    lock, fourth_began, window_closed = threading.Lock(), threading.Event(), threading.Event()

    def unit(*args, **kwargs):
        with lock:  # a unit's place and its start time, read together
            started.append(clock.now())
            place = len(started)
        if place == 4:
            fourth_began.set()
        result = write(*args, **kwargs)
        if place == 3:
            assert fourth_began.wait(timeout=30)
            clock.advance_to(close)
            window_closed.set()
        elif place == 4:
            assert window_closed.wait(timeout=30)
        return result

    monkeypatch.setattr(runner, "write_unit", unit)
    at_pause = []
    clock.on_wait.append(lambda until: at_pause.append((progress_of(lake.runtime.store, job.id), len(started))))
    job = sensor.backfill(source=source, run_between=WINDOW, tz=BERLIN, max_concurrency=2)
    job.wait()

    (info, begun), = at_pause
    assert info["phase"] == "writing" and info["paused_until"] == "2030-01-07T22:00:00+01:00"
    assert begun == 4 and info["units_done"] == begun  # what ran when the window closed finished; nothing new began
    assert "paused until 2030-01-07T22:00:00+01:00" in status_line(info)
    reopen = at("2030-01-07T22:00")
    assert all(t < close for t in started[:begun]) and all(t == reopen for t in started[begun:])
    assert len(started) == 8 and clock.waits == [(close, reopen)]
    assert job.report()["quiet_hours"]["paused_seconds"] == reopen - close
    assert sort_rows(sensor.refresh().to_arrow()).equals(expected(source))


def test_the_diffs_main_tasks_run_in_the_window_and_the_units_after_them_wait_for_it(lake, sensor, clock, monkeypatch):
    """A merge job into days main holds reads main's range for its diff (main tasks: one a day here) before
    its units: the window closes while the first main task runs; it finishes, and the next main task and
    the units start only when the window opens."""
    monkeypatch.setattr(plan_step, "MAIN_TASK_BYTES", 1)
    monkeypatch.setattr(plan_step, "MIN_TASK_BYTES", 1)
    existing = make_readings(recent(8), days=2, devices=3)
    sensor.append(existing)
    source = make_readings(recent(8), days=3, devices=3, seed=1)
    close, reopen = at("2030-01-07T06:00:30"), at("2030-01-07T22:00")
    started: list[tuple[str, float]] = []
    read_main, write = diff_step.read_main, runner.write_unit

    def main_task(*args, **kwargs):
        started.append(("main", clock.now()))
        if len(started) == 1:
            clock.advance_to(close)
        return read_main(*args, **kwargs)

    def unit(*args, **kwargs):
        started.append(("unit", clock.now()))
        return write(*args, **kwargs)

    monkeypatch.setattr(diff_step, "read_main", main_task)
    monkeypatch.setattr(runner, "write_unit", unit)
    job = sensor.backfill(source=source, run_between=WINDOW, tz=BERLIN, max_concurrency=1).wait()

    assert started == [("main", at("2030-01-07T05:50")), ("main", reopen)] + [("unit", reopen)] * 3
    assert clock.waits == [(close, reopen)]
    totals = job.diff()["totals"]
    assert totals["rows_before"] == totals["in_both"] == existing.num_rows
    assert sort_rows(sensor.refresh().to_arrow()).equals(sort_rows(reference_merge(existing, source)))


def test_publish_waits_for_the_window_between_its_commits(lake, sensor, clock):
    source = make_readings(recent(6), days=3, devices=3)
    first_day = pc.min(source["ts"]).as_py().replace(hour=0, minute=0, second=0, microsecond=0)
    first_chunk = source.filter(pc.less(source["ts"], pa.scalar(first_day + timedelta(days=1), SCHEMA.field("ts").type)))
    commits = []

    def committed() -> None:
        commits.append(clock.now())
        if len(commits) == 1:
            clock.advance_to(at("2030-01-07T06:00:30"))

    on_main = []
    clock.on_wait.append(lambda until: on_main.append((lake.job(job.id).status()["phase"], sensor.refresh().to_arrow())))
    with faults.at("publish.chunk", committed):
        job = sensor.backfill(source=source, run_between=WINDOW, tz=BERLIN, publish_by="day")
        job.wait()
    (phase, rows), = on_main
    assert phase == "publishing" and 0 < first_chunk.num_rows < source.num_rows
    assert sort_rows(rows).equals(sort_rows(first_chunk))  # readers saw the first day, and nothing more, all night
    assert commits[1:] == [at("2030-01-07T22:00")] * 2
    assert sort_rows(sensor.refresh().to_arrow()).equals(expected(source))


def test_a_paused_job_stops_on_ctrl_c_and_resumes_with_the_exact_table(lake, sensor, clock):
    clock.advance_to(at("2030-01-07T12:00"))
    source = make_readings(recent(6), days=3, devices=3)
    spec = JobSpec(table="iot.sensor", source="<pyarrow.Table>", run_between=WINDOW, tz=BERLIN)
    lake.create_job(spec)
    cancel = threading.Event()
    clock.on_wait.append(lambda until: cancel.set())  # Ctrl-C while it waits
    with pytest.raises(Interrupted, match="paused for quiet hours"):
        runner.run_job(lake.runtime, spec.job_id, source, cancel)
    info = progress_of(lake.runtime.store, spec.job_id)
    assert info["phase"] == "interrupted" and info["paused_until"] is None
    clock.on_wait.clear()
    clock.advance_to(at("2030-01-07T23:00"))
    job = lake.job(spec.job_id).resume(source=source, wait=True)
    assert job.record().phase == "published" and len(clock.waits) == 1
    assert sort_rows(sensor.refresh().to_arrow()).equals(expected(source))


def test_an_abort_while_paused_removes_what_was_written_and_leaves_main_alone(lake, sensor, clock, monkeypatch):
    existing = make_readings(recent(3), days=1, devices=3)
    sensor.append(existing)
    source = make_readings(recent(12), days=6, devices=3)
    written = []
    write = runner.write_unit

    def unit(*args, **kwargs):
        result = write(*args, **kwargs)
        written.append(result["path"])
        clock.advance_to(at("2030-01-07T06:00:30"))  # the window closes after the first unit
        return result

    monkeypatch.setattr(runner, "write_unit", unit)
    aborted = []
    clock.on_wait.append(lambda until: aborted.append(lake.job(job.id).abort()))  # `timelake backfill abort` meanwhile
    job = sensor.backfill(source=source, run_between=WINDOW, tz=BERLIN, max_concurrency=1)
    with pytest.raises(Aborted):
        job.wait()
    assert aborted[0]["files_deleted"] == len(written) == 1 and job.record().phase == "aborted"
    assert lake.leases("iot.sensor") == [] and len(clock.waits) == 1
    assert sort_rows(sensor.refresh().to_arrow()).equals(sort_rows(existing))


def test_a_job_without_quiet_hours_never_asks_the_clock_to_wait(lake, sensor, clock):
    clock.advance_to(at("2030-01-07T12:00"))
    job = sensor.backfill(source=make_readings(recent(6), days=2, devices=3), tz=BERLIN).wait()
    assert job.record().phase == "published" and clock.waits == [] and job.report()["quiet_hours"] is None
    assert "paused_until" not in job.status()


def test_quiet_hours_in_the_duckdb_call(lake, sensor, clock):
    import duckdb

    from timelake.interfaces.sql import register

    clock.advance_to(at("2030-01-07T12:00"))
    source = make_readings(recent(6), days=2, devices=3)
    con = duckdb.connect()
    register(con, lake)
    con.sql("CREATE TABLE exported AS SELECT * FROM source")
    (job_id, phase, _, written, _), = con.sql(
        f"CALL timelake_backfill('iot.sensor', 'SELECT * FROM exported', run_between := '{WINDOW}', run_tz := '{BERLIN}')"
    ).fetchall()
    assert (phase, written) == ("published", source.num_rows)
    assert clock.waits == [(at("2030-01-07T12:00"), at("2030-01-07T22:00"))]
    assert lake.job(job_id).record().spec["run_between"] == WINDOW


def test_the_window_is_in_the_job_json_and_refused_in_one_line(sensor, warehouse, tmp_path):
    path = tmp_path / "src.parquet"
    pq.write_table(make_readings(recent(6), days=1, devices=2), path)
    for option, message in ((["--run-between", "22:00-30:00"], "run_between: Value error, run_between '22:00-30:00': hours run 00-23"),
                            (["--run-tz", BERLIN], "run_tz is the zone of run_between")):
        code, err = cli_in_process("backfill", "iot.sensor", "--from", str(path), *option, "--warehouse", str(warehouse))
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
    now = datetime.now(UTC)
    # a window open now (the subprocess keeps the system clock): the job runs at once and records it
    between = f"{now - timedelta(hours=1):%H:%M}-{now + timedelta(hours=2):%H:%M}"
    done = cli("backfill", "iot.sensor", "--from", str(path), "--run-between", between, "--json", warehouse=warehouse)
    report = json.loads(done.stdout)
    assert report["phase"] == "published" and report["quiet_hours"]["window"] == f"{between} UTC"
    assert report["quiet_hours"]["pauses"] == 0
