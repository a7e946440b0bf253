"""A full disk (ENOSPC) is a recorded, one-line, resumable failure: proven on a real tmpfs that fills up."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import cli, duplicate_keys, sort_rows


@pytest.fixture
def small_staging(warehouse: Path, sensor):
    """The lake's staging folder on a 1 MiB tmpfs: the job store and the catalog stay on the roomy disk."""
    staging = warehouse / "_backfill"
    staging.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(staging)], check=True)
    try:
        yield staging
    finally:
        subprocess.run(["umount", "-l", str(staging)], check=True)


def test_a_full_disk_fails_the_job_in_one_line_and_resume_finishes_it_once(sensor, warehouse, small_staging, readings, tmp_path):
    source = readings("2025-06-01", days=20, devices=4, step_minutes=1)  # ~4.5 MB of rows: more than staging holds
    path = tmp_path / "big.parquet"
    pq.write_table(source, path)

    failed = cli("backfill", "iot.sensor", "--from", str(path), "--start", "2025-06-01", "--end", "2025-06-21",
                 warehouse=warehouse, check=False)
    assert failed.returncode == 1
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [failed.stderr.strip().splitlines()[-1]]  # one error line, the last (after the job's header)
    assert "no space left on device" in errors[0]
    assert "Traceback" not in failed.stderr
    jobs = json.loads(cli("backfill", "list", "iot.sensor", "--json", warehouse=warehouse).stdout)
    assert len(jobs) == 1
    job = jobs[0]
    assert job["phase"] == "failed" and "\n" not in job["error"]
    assert "no space left on device" in job["error"] and f"timelake backfill resume {job['job_id']}" in job["error"]
    assert errors[0] == f"error: {job['error']}"  # what the user read is what the job store keeps
    assert sensor.refresh().to_arrow().num_rows == 0  # nothing half-published

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_staging)], check=True)  # make room
    cli("backfill", "resume", job["job_id"], warehouse=warehouse)
    main = sensor.refresh().to_arrow()
    assert sort_rows(main).equals(sort_rows(source)) and duplicate_keys(main) == 0
