"""Progress as a user sees it through the real CLI: every step of a job with its own count, the report's
elapsed time per step, a killed runner shown as interrupted (and resumed to the end), no ETA while a
canary waits, and rollups built by `table declare` shown as they go."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import timelake
from tests.conftest import TIMELAKE, cli, recent, sort_rows
from timelake.model.report import STEPS, progress_of


def step_lines(stderr: str) -> dict[str, str]:
    """The lines the CLI prints for the steps when stderr is not a terminal: ``name: numbers``."""
    lines = {}
    for line in stderr.splitlines():
        name, sep, rest = line.partition(": ")
        if sep and name.split(" ")[0] in STEPS:
            lines[name] = rest
    return lines


@pytest.fixture
def export(tmp_path, readings) -> Path:
    """Two days of three devices, hourly, in two Parquet files: 144 rows."""
    folder = tmp_path / "export"
    folder.mkdir()
    rows = readings(recent(6), days=2, devices=3)
    pq.write_table(rows.slice(0, 72), folder / "a.parquet")
    pq.write_table(rows.slice(72), folder / "b.parquet")
    return folder


def test_every_step_shows_its_count_and_the_report_times_each(sensor, warehouse, export, readings):
    sensor.append(readings(recent(20), days=2, devices=2))
    declared = cli("table", "declare", "iot.sensor", "--rollup", "1h:value", "--rule", "high: value > 50",
                   warehouse=warehouse)
    assert "built iot.sensor_1h: 2/2 chunks" in declared.stderr  # one chunk per day of the table

    began = time.time()
    result = cli("backfill", "iot.sensor", "--from", str(export), "--evaluate-rules", warehouse=warehouse)
    wall = time.time() - began
    steps = step_lines(result.stderr)
    assert list(steps) == list(STEPS), result.stderr
    assert steps["scan"].startswith("2/2 source pieces, 144 rows")
    assert steps["write"].startswith("2/2 units, 144/144 rows")  # a unit per day
    assert steps["stage"].startswith("2/2 files")
    assert steps["validate"].startswith("2/2 files")
    assert steps["publish"].startswith("1/1 chunks")
    assert steps["refresh"].startswith("3/3 rollup chunks and rules")  # 2 days of the 1h rollup, then the rules
    assert "None" not in result.stdout

    job_id = result.stderr.split()[1]
    report = timelake.connect(warehouse=warehouse).job(job_id).report()
    assert [s["name"] for s in report["steps"]] == list(STEPS) and {s["state"] for s in report["steps"]} == {"done"}
    assert 0 < report["elapsed_seconds"] < wall
    assert report["elapsed_seconds"] == pytest.approx(sum(s["elapsed_seconds"] for s in report["steps"]), abs=0.01)
    assert all(s["eta_seconds"] is None for s in report["steps"])


def _status(job_id: str, warehouse: Path) -> dict:
    """What ``timelake backfill status JOB --json`` prints, read in this process (the same function)."""
    return progress_of(timelake.connect(warehouse=warehouse).runtime.store, job_id)


def test_a_killed_runner_is_interrupted_and_resume_finishes_it(sensor, warehouse, tmp_path, readings):
    source = readings(recent(10), days=3, devices=3)
    pq.write_table(source, tmp_path / "three-days.parquet")
    env = {**os.environ, "TIMELAKE_WAREHOUSE": str(warehouse), "TIMELAKE_SLOW_AT": "write.unit:120"}
    began = time.time()
    proc = subprocess.Popen([TIMELAKE, "backfill", "iot.sensor", "--from", str(tmp_path / "three-days.parquet"),
                             "--max-concurrency", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    store = timelake.connect(warehouse=warehouse).runtime.store
    deadline = time.time() + 60
    while time.time() < deadline and not any(u.status == "done" for j in store.list_jobs() for u in store.units(j.job_id)):
        time.sleep(0.05)
    job_id = store.list_jobs()[0].job_id
    running = _status(job_id, warehouse)
    assert running["phase"] == "writing" and running["step"] == "write" and running["units_done"] == 1
    second = cli("backfill", "resume", job_id, warehouse=warehouse, check=False)  # one process runs a job at a time
    assert second.returncode == 1 and second.stderr.strip() == (
        f"error: job {job_id} is running in another process; follow it with: timelake backfill status {job_id} --watch")

    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    killed = time.time()
    stopped = _status(job_id, warehouse)
    assert (stopped["phase"], stopped["stopped_in"], stopped["eta_seconds"]) == ("interrupted", "writing", None)
    assert [s["state"] for s in stopped["steps"] if s["name"] == "write"] == ["interrupted"]
    assert all(s["eta_seconds"] is None for s in stopped["steps"])
    line = cli("backfill", "status", job_id, warehouse=warehouse).stdout
    assert "interrupted in writing" in line and f"resume with: timelake backfill resume {job_id}" in line
    assert "ETA" not in line
    listed = cli("backfill", "list", warehouse=warehouse).stdout
    assert f"{job_id}\tiot.sensor\tmerge\tinterrupted" in listed

    time.sleep(1)  # time no process runs the job: it counts for no step
    resumed = time.time()
    cli("backfill", "resume", job_id, warehouse=warehouse)
    wall = time.time() - began
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(source))
    report = timelake.connect(warehouse=warehouse).job(job_id).report()
    assert report["phase"] == "published" and report["progress"]["units_done"] == 3  # a unit per day
    assert report["elapsed_seconds"] == pytest.approx(sum(s["elapsed_seconds"] for s in report["steps"]), abs=0.01)
    assert report["elapsed_seconds"] < wall - (resumed - killed)
    assert _status(job_id, warehouse)["phase"] == "published"


def test_a_canary_waiting_for_approval_has_no_eta(sensor, warehouse, readings):
    job = sensor.backfill(source=readings(recent(8), days=3, devices=2), canary=recent(7)).wait()
    info = _status(job.id, warehouse)
    assert info["phase"] == "awaiting-approval" and info["eta_seconds"] is None
    assert all(s["eta_seconds"] is None for s in info["steps"])
    line = cli("backfill", "status", job.id, warehouse=warehouse).stdout
    assert "ETA" not in line and f"approve with: timelake backfill continue {job.id}" in line
