"""Where a job's writers run: two writers are threads of the job's own process whatever the rows (two
threads keep two cores busy and a process pool only adds its start); more writers on a job above the
row limit are worker processes. Either way the table ends the same."""

from __future__ import annotations

import os
import threading

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
