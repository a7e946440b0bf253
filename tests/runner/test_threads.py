"""Two embedded jobs on threads of one process at once, one of them fanning out to worker processes:
both exact, and the process that ran them is as it was (its main module, its collector, its umask)."""

from __future__ import annotations

import gc
import os
import sys

from tests.conftest import recent, sort_rows


def test_two_jobs_on_threads_of_one_process_are_both_exact(lake, readings, monkeypatch):
    monkeypatch.setenv("TIMELAKE_IN_PROCESS_ROWS", "0")  # the job with three writers fans out to processes
    main_spec, collecting, umask = getattr(sys.modules["__main__"], "__spec__", None), gc.isenabled(), os.umask(0o022)
    os.umask(umask)
    schema = readings(recent(3)).schema
    a = lake.create_table("iot.a", schema=schema, time_column="ts", series_key=["device_id"], partition_by="day")
    b = lake.create_table("iot.b", schema=schema, time_column="ts", series_key=["device_id"], partition_by="day")
    rows_a = readings(recent(20), days=6, devices=3, seed=1)
    rows_b = readings(recent(20), days=6, devices=4, seed=2)
    b.append(rows_b.slice(0, 10))
    jobs = [a.backfill(source=rows_a, max_concurrency=3, publish_by="day"), b.backfill(source=rows_b, max_concurrency=2)]
    for job in jobs:
        job.wait()
        assert job.record().phase == "published"
    assert sort_rows(a.refresh().to_arrow()).equals(sort_rows(rows_a))
    assert sort_rows(b.refresh().to_arrow()).equals(sort_rows(rows_b))
    assert getattr(sys.modules["__main__"], "__spec__", None) is main_spec
    assert gc.isenabled() == collecting
    assert os.umask(umask) == umask
