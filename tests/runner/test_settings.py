"""Settings changed on a running job (`timelake backfill set`, `Job.set`): the fan-out reads the job's
concurrency as units finish, and the source throttle reads the job's rate as it reserves rows. The
effect is measured: units running at once, counted around each write, and the time the throttle made
the scan wait, on a clock the test controls (so no assertion depends on the machine's speed)."""

from __future__ import annotations

import threading
import time

import pyarrow.parquet as pq
import pytest

import timelake.runner as runner
from tests.clock import TestClock
from tests.conftest import SCHEMA, cli_in_process, make_readings, recent, reference_merge, sort_rows

UNIT_SECONDS = 0.15  # each unit holds its writer this long, so that units started together overlap


class Overlap:
    """Units being written right now, and the most at once since `mark`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peaks: list[int] = [0]

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.peaks[-1] = max(self.peaks[-1], self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1

    def mark(self) -> None:
        with self.lock:
            self.peaks.append(self.now)


def test_a_concurrency_set_mid_job_changes_the_units_written_at_once(lake, sensor, monkeypatch):
    source = make_readings(recent(16), days=12, devices=3)  # twelve day units
    overlap, done = Overlap(), []
    write = runner.write_unit

    def unit(*args, **kwargs):
        with overlap:
            result = write(*args, **kwargs)
            time.sleep(UNIT_SECONDS)
        done.append(result)
        if len(done) == 2:
            job.set(max_concurrency=3)
            overlap.mark()
        if len(done) == 8:
            job.set(max_concurrency=2)
            overlap.mark()
        return result

    monkeypatch.setattr(runner, "write_unit", unit)
    job = sensor.backfill(source=source, max_concurrency=1)
    job.wait()
    assert len(done) == 12 and overlap.peaks == [1, 3, 2]
    report = job.report()
    assert report["settings"] == {"max_concurrency": 2, "source_rows_per_second": None}
    assert [{k: v for k, v in change.items() if k != "at"} for change in report["settings_changes"]] == [
        {"max_concurrency": 3}, {"max_concurrency": 2}]
    assert job.record().spec["max_concurrency"] == 1  # the submitted job stays as it was submitted
    assert sort_rows(sensor.refresh().to_arrow()).equals(sort_rows(reference_merge(SCHEMA.empty_table(), source)))


FILES, ROWS_PER_FILE, OLD_RATE, NEW_RATE, SET_AFTER = 20, 5_000, 1_000, 100_000, 20.0


def test_a_rate_set_mid_scan_applies_from_the_next_rows_read(lake, sensor, tmp_path):
    """Twenty files of 5,000 rows read by one scan task at 1,000 rows/s: each file waits 5 s on the job's
    clock. After 20 s (four files) the rate goes to 100,000 rows/s; the other sixteen files then wait
    0.05 s each, so the scan waits 20.8 s in all instead of 100 s."""
    folder = tmp_path / "export"
    folder.mkdir()
    source = make_readings(recent(30), days=25, devices=25, step_minutes=9)
    assert source.num_rows >= FILES * ROWS_PER_FILE
    for i in range(FILES):
        pq.write_table(source.slice(i * ROWS_PER_FILE, ROWS_PER_FILE), folder / f"part-{i:02d}.parquet")
    clock = lake.runtime.clock = TestClock(time.time())

    def after_sleep(now: float) -> None:
        if clock.slept >= SET_AFTER and not changed:
            changed.append(lake.job(job.id).set(source_rows_per_second=NEW_RATE))

    changed: list[dict] = []
    clock.on_sleep.append(after_sleep)
    job = sensor.backfill(source=f"{folder}/*.parquet", max_concurrency=1, source_rows_per_second=OLD_RATE)
    job.wait()
    read_before = SET_AFTER * OLD_RATE
    assert changed[0]["settings"]["source_rows_per_second"] == NEW_RATE
    assert clock.slept == pytest.approx(SET_AFTER + (FILES * ROWS_PER_FILE - read_before) / NEW_RATE)
    assert job.report()["source_limits"]["rows_per_second"] == NEW_RATE
    read = sort_rows(source.slice(0, FILES * ROWS_PER_FILE))
    assert sort_rows(sensor.refresh().to_arrow()).equals(sort_rows(reference_merge(SCHEMA.empty_table(), read)))


def test_set_refuses_a_finished_job_and_an_empty_change_in_one_line(lake, sensor, warehouse):
    job = sensor.backfill(source=make_readings(recent(6), days=1, devices=2)).wait()
    for args, message in ((["--max-concurrency", "4"], f"job {job.id} is published: settings change a job that has not finished"),
                          ([], "nothing to set: give --max-concurrency and/or --source-rows-per-second")):
        code, err = cli_in_process("backfill", "set", job.id, *args, "--warehouse", str(warehouse))
        assert code == 1 and err.strip() == f"error: {message}", err
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        job.set(max_concurrency=0)
