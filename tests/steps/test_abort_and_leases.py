"""Abort leaves no branch, lease or unpublished file and main untouched; leases tell a compactor
which ranges to skip."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import timelake
from tests.conftest import cli, recent, stage_job
from timelake.errors import BackfillError



def _staged_paths(lake, job_id) -> list[Path]:
    return [Path(u.result["path"].removeprefix("file://")) for u in lake.runtime.store.units(job_id) if u.result.get("path")]


def test_abort_a_staged_job_leaves_no_trace(lake, sensor, readings, warehouse):
    sensor.append(readings(recent(9), days=1, devices=2))
    before = sensor.refresh().iceberg.metadata.refs["main"]
    job_id = stage_job(lake, readings(recent(6), days=3, devices=2))
    files = _staged_paths(lake, job_id)
    assert len(files) == 3 and all(p.exists() for p in files)
    assert lake.is_range_leased("iot.sensor", recent(5), recent(4))
    assert timelake.is_range_leased("iot.sensor", recent(5), recent(4), warehouse=str(warehouse))
    assert not lake.is_range_leased("iot.sensor", recent(20), recent(10))

    result = lake.job(job_id).abort()
    assert result == {"job_id": job_id, "phase": "aborted", "files_deleted": 3, "files_kept_on_main": 0}
    table = sensor.refresh().iceberg
    assert f"backfill/{job_id}" not in table.metadata.refs and table.metadata.refs["main"] == before
    assert not any(p.exists() for p in files)
    assert not Path(lake.runtime.config.staging.removeprefix("file://"), job_id).exists()
    assert lake.leases() == [] and not lake.is_range_leased("iot.sensor", recent(5), recent(4))
    assert lake.job(job_id).abort()["phase"] == "aborted"  # idempotent
    with pytest.raises(BackfillError, match="aborted"):
        lake.job(job_id).resume(wait=True)


def test_abort_a_running_job_stops_it(lake, sensor, readings):
    job = sensor.backfill(source=readings(recent(90), days=80, devices=2, step_minutes=120), max_concurrency=1)
    deadline = time.time() + 30
    while lake.runtime.store.get_job(job.id).phase != "writing" and time.time() < deadline:
        time.sleep(0.01)
    result = job.abort()
    assert result["phase"] == "aborted" and lake.job(job.id).record().phase == "aborted"
    assert sensor.to_arrow().num_rows == 0 and lake.leases() == []
    assert f"backfill/{job.id}" not in sensor.refresh().iceberg.metadata.refs
    data = Path(sensor.iceberg.location().removeprefix("file://"), "data")
    assert not data.exists() or not any(p.name.startswith(job.id) for p in data.rglob("*.parquet"))


def test_a_published_job_cannot_be_aborted(lake, sensor, readings):
    job = sensor.backfill(source=readings(recent(5), days=1)).wait()
    with pytest.raises(BackfillError, match="published"):
        job.abort()
    assert sensor.to_arrow().num_rows == 72


def test_leases_and_abort_from_the_cli(lake, sensor, readings, warehouse):
    job_id = stage_job(lake, readings(recent(6), days=2, devices=2))
    env_args = ["--warehouse", str(warehouse), "--json"]
    held = json.loads(cli("backfill", "leases", "iot.sensor", *env_args, warehouse=warehouse).stdout)
    assert held == [{"job_id": job_id, "table": "iot.sensor", "start": f"{recent(6)}T00:00:00Z", "end": f"{recent(4)}T00:00:00Z"}]
    aborted = json.loads(cli("backfill", "abort", job_id, *env_args, warehouse=warehouse).stdout)
    assert aborted["files_deleted"] == 2
    assert json.loads(cli("backfill", "leases", "iot.sensor", *env_args, warehouse=warehouse).stdout) == []
