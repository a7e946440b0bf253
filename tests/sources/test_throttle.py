"""Source limits: their defaults per kind of source, and the row rate on a source that does not pace itself."""

from __future__ import annotations

import time

import pyarrow.parquet as pq

from tests.conftest import make_readings, recent
from timelake.model.limits import limits
from timelake.model.spec import JobSpec


def test_databases_get_conservative_defaults_files_none_and_zero_lifts_the_rate():
    database = "postgresql://reader@db/metrics?table=public.readings"
    assert limits(JobSpec(table="iot.sensor", source=database)) == limits(JobSpec(
        table="iot.sensor", source=database, source_max_connections=2, source_rows_per_second=250_000))
    assert (limits(JobSpec(table="iot.sensor", source=database)).max_connections,
            limits(JobSpec(table="iot.sensor", source=database)).rows_per_second) == (2, 250_000)
    lifted = limits(JobSpec(table="iot.sensor", source=database, source_rows_per_second=0))
    assert (lifted.max_connections, lifted.rows_per_second) == (2, None)
    files = limits(JobSpec(table="iot.sensor", source="exports/*.parquet"))
    assert (files.max_connections, files.rows_per_second) == (None, None)
    assert files.scan_workers(8) == 8 and limits(JobSpec(table="iot.sensor", source=database)).scan_workers(8) == 2


def test_a_file_source_is_held_to_the_rate_after_each_batch(sensor, tmp_path):
    """A file source has no pacing of its own: the scan waits after each batch it yields."""
    rows = make_readings(recent(20), days=10, devices=10)  # 2,400 rows
    pq.write_table(rows, tmp_path / "export.parquet")
    began = time.perf_counter()
    report = sensor.backfill(source=str(tmp_path / "export.parquet"), dry_run=True, source_rows_per_second=1_000).wait().report()
    seconds = time.perf_counter() - began
    assert report["rows_in_source"] == 2_400 and 2.4 <= seconds < 6, seconds
    assert report["source_limits"] == {"max_connections": None, "rows_per_second": 1_000, "read_eta_seconds": 2.4}
