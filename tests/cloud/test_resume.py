"""Failures that resume: a write Lambda that crashes (as a timeout or out-of-memory does, `Lambda.Unknown`)
on its first three calls for one unit. The workflow retries it, gives up, records the failure and fails;
`resume` (CLI or API) then starts a new execution of the same job that writes only what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import pytest

import timelake
from tests.cloud.conftest import BUCKET, Cloud, _Context, load_function, sensor_table
from tests.cloud.test_workflow import _upload
from tests.conftest import recent, sort_rows

CRASH = type("Lambda.Unknown", (Exception,), {})  # the error name Step Functions gives a crashed or timed-out Lambda


def _resume_with_cli(cloud: Cloud, job_id: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("TIMELAKE_STATE_MACHINE_ARN", cloud.state_machine_arn)
    done = subprocess.run([str(Path(sys.executable).parent / "timelake"), "backfill", "resume", job_id, "--on", "aws", "--json"],
                          capture_output=True, text=True, env=os.environ.copy(), timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _resume_with_api(cloud: Cloud, job_id: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("STATE_MACHINE_ARN", cloud.state_machine_arn)
    path = f"/backfills/{job_id}/resume"
    event = {"resource": path, "path": path, "httpMethod": "POST", "headers": {"Content-Type": "application/json"},
             "multiValueHeaders": {}, "queryStringParameters": None, "multiValueQueryStringParameters": None,
             "pathParameters": None, "stageVariables": None, "isBase64Encoded": False, "body": None,
             "requestContext": {"httpMethod": "POST", "path": path, "stage": "v1", "requestId": "r1",
                                "identity": {"userArn": "arn:aws:iam::123456789012:user/operator"}}}
    response = load_function("api").handler(event, _Context("timelake-api"))
    assert response["statusCode"] == 202, response
    return json.loads(response["body"])


@pytest.mark.parametrize("resume", [_resume_with_cli, _resume_with_api], ids=["cli", "api"])
def test_a_crashing_unit_fails_the_job_and_resume_finishes_it_once(cloud: Cloud, readings, tmp_path, monkeypatch, resume) -> None:
    source = readings(recent(7), days=3, devices=3, seed=4)
    table = sensor_table(cloud.lake)
    _upload(source, "src/a.parquet")
    calls: Counter[str] = Counter()
    failing: list[str] = []

    def crash_three_times(event: dict[str, Any]) -> None:
        unit = event["unit_id"]
        calls[unit] += 1
        failing[:] = failing or [unit]
        if unit == failing[0] and calls[unit] <= 3:
            raise CRASH(f"unit {unit}: Runtime exited with error: signal: killed")

    cloud.before["timelake-write"] = crash_three_times
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet", "publish_by": "day", "job_id": "bf-crash"}
    failed = cloud.run(job, "bf-crash")
    assert failed["status"] == "FAILED"
    assert "Lambda.Unknown" in failed["cause"] or f"not written yet (first: {failing[0]})" in failed["cause"]
    assert calls[failing[0]] == 3  # the first call and two retries
    assert cloud.lake.job("bf-crash").status()["phase"] == "failed"
    assert table.refresh().iceberg.current_snapshot() is None

    resumed = resume(cloud, "bf-crash", monkeypatch)
    assert resumed["how"] == "new execution"  # the failure was caught into the Fail state: a redrive would rerun nothing
    assert cloud.wait(resumed["execution_arn"])["status"] == "SUCCEEDED"
    report = cloud.lake.job("bf-crash").report()
    assert report["phase"] == "published"
    written = {unit: n - (3 if unit == failing[0] else 0) for unit, n in calls.items()}
    assert written == {unit: 1 for unit in written} and len(written) == report["units"] == 3  # each unit once

    embedded = timelake.connect(warehouse=tmp_path / "embedded")
    local = embedded.create_table("iot.sensor", schema=table.iceberg.schema().as_arrow(), time_column="ts",
                                  series_key=["device_id"], partition_by="day", retention="P3Y")
    local.backfill(source=source, publish_by="day").wait()
    assert sort_rows(table.refresh().to_arrow()).equals(sort_rows(local.to_arrow()))


def test_unit_files_deleted_before_staging_fail_the_execution_and_resume_writes_them_again(
        cloud: Cloud, readings, monkeypatch) -> None:
    """Another engine's orphan-file removal takes a written unit's file before the stage Lambda commits
    it. The stage function may not write data files: it names the loss and fails the execution, with the
    unit pending again; the resumed execution's write map writes it once more, and the job publishes exactly."""
    source = readings(recent(7), days=3, devices=3, seed=5)
    table = sensor_table(cloud.lake)
    _upload(source, "src/a.parquet")
    removed: list[str] = []
    writes: Counter[str] = Counter()

    def remove_one(event: dict[str, Any]) -> None:
        if not removed:
            unit = cloud.lake.runtime.store.units(event["job_id"])[1]
            bucket, _, key = unit.result["path"].removeprefix("s3://").partition("/")
            boto3.client("s3").delete_object(Bucket=bucket, Key=key)
            removed.append(unit.unit_id)

    cloud.before["timelake-stage"] = remove_one
    cloud.before["timelake-write"] = lambda event: writes.update([event["unit_id"]])
    failed = cloud.run({"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet", "job_id": "bf-orphans"}, "bf-orphans")
    assert failed["status"] == "FAILED" and "deleted before staging" in failed["cause"] and removed[0] in failed["cause"]
    assert table.refresh().iceberg.current_snapshot() is None

    resumed = _resume_with_cli(cloud, "bf-orphans", monkeypatch)
    assert cloud.wait(resumed["execution_arn"])["status"] == "SUCCEEDED"
    assert cloud.lake.job("bf-orphans").report()["phase"] == "published"
    assert writes[removed[0]] == 2 and all(n == 1 for unit, n in writes.items() if unit != removed[0])
    assert sort_rows(table.refresh().to_arrow()).equals(sort_rows(source))
