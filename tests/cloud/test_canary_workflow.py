"""Canary on moto: the real workflow pauses on its task token, approve resumes it, reject and a timeout abort."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from tests.cloud.conftest import BUCKET, Cloud, sensor_table
from tests.cloud.test_api import api  # noqa: F401
from tests.cloud.test_workflow import _upload
from tests.conftest import recent, reference_merge, sort_rows
from timelake.interfaces.orchestrator import StepFunctionsOrchestrator
from timelake.model.spec import JobSpec

TIMELAKE = str(Path(sys.executable).parent / "timelake")


def _start(cloud: Cloud, job_id: str, **extra) -> str:
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet", "canary": True, "job_id": job_id, **extra}
    return _orchestrator(cloud).submit(JobSpec.model_validate(job))["execution_arn"]


def _orchestrator(cloud: Cloud) -> StepFunctionsOrchestrator:
    return StepFunctionsOrchestrator(cloud.lake.runtime, cloud.state_machine_arn, cloud.sfn)


def _until_waiting(cloud: Cloud, job_id: str, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = cloud.lake.runtime.store.get_job(job_id)
        if job.state.get("approval_token"):
            return job.state
        assert job.phase not in ("failed", "failed_validation"), job.state.get("error")
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} never waited for approval")


@pytest.fixture
def staged_day(cloud: Cloud, readings):
    """Main holds day -6; the source covers days -7 … -5, two files."""
    table = sensor_table(cloud.lake)
    existing = readings(recent(6), days=1, devices=2, seed=1)
    table.append(existing)
    source = readings(recent(7), days=3, devices=2, seed=2)
    _upload(source.slice(0, 100), "src/a.parquet")
    _upload(source.slice(100), "src/b.parquet")
    return table, existing, source


def test_approve_resumes_the_paused_workflow_to_the_full_result(cloud: Cloud, staged_day, api):  # noqa: F811
    table, existing, source = staged_day
    main_before = table.refresh().iceberg.metadata.refs["main"].snapshot_id
    arn = _start(cloud, "bf-canary-ok")
    state = _until_waiting(cloud, "bf-canary-ok")
    assert cloud.sfn.describe_execution(executionArn=arn)["status"] == "RUNNING"
    job = cloud.lake.job("bf-canary-ok")
    assert job.record().phase == "awaiting-approval" and state["canary"]["day"] == recent(7)
    assert cloud.invocations.count("timelake-write") == 1  # only the canary day's unit
    assert table.refresh().iceberg.metadata.refs["main"].snapshot_id == main_before
    assert cloud.lake.is_range_leased("iot.sensor", recent(5), recent(4))
    code, report = api("GET", "/backfills/bf-canary-ok/report")
    canary_report = report["canary"]
    assert code == 200 and canary_report["day"] == recent(7) and canary_report["rows_written"] == 48
    assert all(c["passed"] for c in canary_report["checks"]) and canary_report["samples"]
    assert canary_report["samples"][0]["origin"] == f"row 1 of s3://{BUCKET}/src/a.parquet"
    assert canary_report["diff"]["totals"] == {**canary_report["diff"]["totals"], "rows_before": 0, "only_after": 48}

    code, approved = api("POST", "/backfills/bf-canary-ok/approve")
    assert code == 202 and approved["how"].startswith("approved"), approved
    result = cloud.wait(arn)
    assert result["status"] == "SUCCEEDED", result
    assert sort_rows(table.refresh().to_arrow()).equals(reference_merge(existing, source))
    # the canary unit was not written again; the diff's main task (main's day -6) ran after the approval
    assert cloud.invocations.count("timelake-write") == 4
    assert job.report()["diff"]["totals"]["in_both"] == existing.num_rows
    assert job.record().phase == "published" and cloud.lake.leases() == []
    code, again = api("POST", "/backfills/bf-canary-ok/approve")
    assert code == 409 and "not waiting for a canary decision" in again["message"]


@pytest.mark.parametrize("how", ["api", "cli"])
def test_reject_ends_in_the_abort_path_with_main_untouched(cloud: Cloud, staged_day, api, how):  # noqa: F811
    table, _, _ = staged_day
    main_before = table.refresh().iceberg.metadata.refs["main"].snapshot_id
    job_id = f"bf-canary-no-{how}"
    arn = _start(cloud, job_id)
    _until_waiting(cloud, job_id)
    if how == "api":
        code, rejected = api("POST", f"/backfills/{job_id}/reject")
        assert code == 202 and rejected["how"].startswith("rejected"), rejected
    else:
        env = {**os.environ, "TIMELAKE_CONFIG": cloud.config.model_dump_json(), "TIMELAKE_STATE_MACHINE_ARN": cloud.state_machine_arn}
        run = subprocess.run([TIMELAKE, "backfill", "abort", job_id, "--on", "aws"], capture_output=True, text=True,
                             env=env, timeout=120)
        assert run.returncode == 0 and "rejected: the workflow aborts the job" in run.stdout, run.stderr
    result = cloud.wait(arn)
    assert result["status"] == "SUCCEEDED", result  # a decision, not a failure: no failed-executions alarm
    assert json.loads(result["output"]) == {"error": "CanaryRejected", "cause": f"job {job_id}: the canary was rejected; aborted"}
    _assert_aborted(cloud, table, job_id, main_before)


def test_no_decision_before_the_timeout_aborts(cloud: Cloud, staged_day):
    table, _, _ = staged_day
    main_before = table.refresh().iceberg.metadata.refs["main"].snapshot_id
    arn = _start(cloud, "bf-canary-late", approval_timeout_seconds=1)
    result = cloud.wait(arn, timeout=60)
    assert result["status"] == "FAILED" and result["error"] == "ApprovalTimedOut", result
    _assert_aborted(cloud, table, "bf-canary-late", main_before)


def _assert_aborted(cloud: Cloud, table, job_id: str, main_before: int) -> None:
    """Nothing of the job is left: not on main, no branch, no lease, no written or staging file."""
    paths = [u.result["path"] for u in cloud.lake.runtime.store.units(job_id) if u.result.get("path")]
    assert len(paths) == 1  # the canary day's unit was written, and then removed
    job = cloud.lake.job(job_id).record()
    assert job.phase == "aborted" and not job.state.get("approval_token")
    iceberg = table.refresh().iceberg
    assert iceberg.metadata.refs["main"].snapshot_id == main_before and f"backfill/{job_id}" not in iceberg.metadata.refs
    assert cloud.lake.leases() == []
    s3 = boto3.client("s3")
    for path in paths:
        key = path.split(f"s3://{BUCKET}/", 1)[1]
        assert s3.list_objects_v2(Bucket=BUCKET, Prefix=key)["KeyCount"] == 0
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"_backfill/{job_id}")["KeyCount"] == 0
