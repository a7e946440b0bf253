"""The CLI as a user runs it: real subprocesses, exit codes, one-line errors, JSON output."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import timelake
from tests.conftest import TIMELAKE, cli, recent


@pytest.fixture
def export(tmp_path, readings) -> Path:
    folder = tmp_path / "export"
    folder.mkdir()
    rows = readings(recent(8), days=2, devices=2)
    renamed = rows.rename_columns(["timestamp", "tag_name", "val"])
    pq.write_table(renamed.slice(0, 48), folder / "a.parquet")
    pq.write_table(renamed.slice(48), folder / "b.parquet")
    return folder


def test_backfill_json_report_then_status_and_list(sensor, warehouse, export):
    args = ["backfill", "iot.sensor", "--from", f"{export}/*.parquet", "--map", "ts=timestamp,device_id=tag_name,value=val"]
    dry = json.loads(cli(*args, "--dry-run", "--json", warehouse=warehouse).stdout)
    assert dry["phase"] == "dry_run_complete" and dry["rows_in_source"] == 96
    for key in ("job_id", "table", "mode", "rows_written", "rows_duplicate_in_source", "rows_conflicting_existing",
                "rows_outside_retention", "rows_outside_range", "rows_rejected", "time_range", "units", "files",
                "overlap_existing_rows", "estimated_cost", "source_gaps", "checks", "published_snapshot_ids"):
        assert key in dry
    report = json.loads(cli(*args, "--json", warehouse=warehouse).stdout)
    assert report["phase"] == "published" and report["rows_written"] == 96
    status = json.loads(cli("backfill", "status", report["job_id"], "--json", warehouse=warehouse).stdout)
    assert status["units_done"] == status["units_total"] == 2 and status["rows_processed"] == 96
    listed = json.loads(cli("backfill", "list", "iot.sensor", "--json", warehouse=warehouse).stdout)
    assert [(j["job_id"], j["rows_written"]) for j in listed] == [(report["job_id"], 96)]  # no dry runs unless asked
    listed = json.loads(cli("backfill", "list", "iot.sensor", "--dry-runs", "--json", warehouse=warehouse).stdout)
    assert [j["job_id"] for j in listed] == [dry["job_id"], report["job_id"]]
    assert timelake.connect(warehouse=warehouse).table("iot.sensor").to_arrow().num_rows == 96


def test_job_file(sensor, warehouse, export, tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"table": "iot.sensor", "source": f"{export}/*.parquet", "mode": "append",
                               "map": {"ts": "timestamp", "device_id": "tag_name", "value": "val"}}))
    report = json.loads(cli("backfill", "iot.sensor", "--job", str(job), "--json", warehouse=warehouse).stdout)
    assert report["mode"] == "append" and report["rows_written"] == 96


@pytest.mark.parametrize("args, message", [
    (["--from", "{export}/*.parquet"], "column 'ts' (source 'ts') is required but missing from the source (source columns: timestamp, tag_name, val)"),
    (["--from", "{export}/*.parquet", "--map", "ts=timestamp,device_id=tag_name,value=val", "--mode", "upsert"], "mode"),
    (["--from", "{export}/*.parquet", "--map", "ts"], "is not table_column=source_column"),
    (["--from", "{export}/none-*.parquet"], "no source files match"),
])
def test_errors_are_one_line_and_nonzero(sensor, warehouse, export, args, message):
    result = cli("backfill", "iot.sensor", *[a.format(export=export) for a in args], warehouse=warehouse, check=False)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and last.startswith(("error:", "Error", "│", "╰"))


def test_unknown_job_and_table(warehouse, sensor):
    result = cli("backfill", "status", "bf-nope", warehouse=warehouse, check=False)
    assert result.returncode == 1 and "no backfill job 'bf-nope'" in result.stderr
    result = cli("backfill", "iot.other", "--from", "x.parquet", warehouse=warehouse, check=False)
    assert result.returncode == 1 and "table 'iot.other' does not exist" in result.stderr


def test_schema_command_prints_the_job_schema(warehouse):
    schema = json.loads(cli("backfill", "schema", warehouse=warehouse).stdout)
    assert schema["title"] == "JobSpec" and "mode" in schema["properties"]
    assert Path(__file__).parents[2].joinpath("docs", "job.schema.json").read_text().strip() == json.dumps(schema, indent=2)


def test_ctrl_c_leaves_a_resumable_job(sensor, warehouse, tmp_path, readings):
    import signal
    import time

    from tests.conftest import sort_rows

    source = readings(recent(320), days=300, devices=3, step_minutes=60)  # 300 units: a write phase long enough to catch
    pq.write_table(source, tmp_path / "long.parquet")
    env = {**os.environ, "TIMELAKE_WAREHOUSE": str(warehouse)}
    proc = subprocess.Popen([TIMELAKE, "backfill", "iot.sensor", "--from", str(tmp_path / "long.parquet"),
                             "--max-concurrency", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = timelake.connect(warehouse=warehouse).runtime.store
    deadline = time.time() + 60
    while time.time() < deadline:
        jobs = store.list_jobs()
        if jobs and jobs[0].phase == "writing" and any(u.status == "done" for u in store.units(jobs[0].job_id)):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    job_id = store.list_jobs()[0].job_id
    assert proc.returncode == 130, err
    assert f"timelake backfill resume {job_id}" in err
    done = sum(u.status == "done" for u in store.units(job_id))
    assert 0 < done < len(store.units(job_id)) == 300
    assert sensor.to_arrow().num_rows == 0
    cli("backfill", "resume", job_id, warehouse=warehouse)
    assert sort_rows(sensor.to_arrow()).equals(sort_rows(source))


def test_declare_rules_and_rollups_then_backfill_with_evaluate_rules(sensor, warehouse, export, readings):
    sensor.append(readings(recent(20), days=1, devices=2))
    cli("table", "declare", "iot.sensor", "--rollup", "1d:value", "--rule", "high: value > 50 for PT1H severity critical",
        warehouse=warehouse)
    shown = json.loads(cli("table", "show", "iot.sensor", "--json", warehouse=warehouse).stdout)
    assert shown["rollups"] == [{"interval": "1d", "columns": ["value"], "table": "iot.sensor_1d"}]
    assert shown["rules"] == [{"name": "high", "column": "value", "op": ">", "threshold": 50.0, "for": "PT1H", "severity": "critical"}]
    assert timelake.connect(warehouse=warehouse).catalog.load_table("iot.sensor_1d").scan().to_arrow().num_rows == 2
    report = json.loads(cli("backfill", "iot.sensor", "--from", str(export), "--map", "ts=timestamp,device_id=tag_name,value=val",
                            "--evaluate-rules", "--json", warehouse=warehouse).stdout)
    assert report["phase"] == "published"
    events = json.loads(cli("table", "events", "iot.sensor", "--source", "backfill", "--json", warehouse=warehouse).stdout)
    assert events and {e["job_id"] for e in events} == {report["job_id"]} and {e["rule"] for e in events} == {"high"}
    bad = cli("table", "declare", "iot.sensor", "--rule", "high value", warehouse=warehouse, check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("error: cannot read rule 'high value'")
