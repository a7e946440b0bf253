"""The API handler with API Gateway proxy events, against moto and the real workflow."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.cloud.conftest import BUCKET, ROOT, Cloud, _Context, load_function, sensor_table
from tests.cloud.test_workflow import _upload
from tests.conftest import recent


def _api_module() -> Any:
    return load_function("api")


@pytest.fixture
def api(cloud: Cloud, monkeypatch):
    monkeypatch.setenv("STATE_MACHINE_ARN", cloud.state_machine_arn)
    module = _api_module()

    def call(method: str, path: str, body: Any = None, query: dict[str, str] | None = None) -> tuple[int, Any]:
        event = {
            "resource": path, "path": path, "httpMethod": method, "headers": {"Content-Type": "application/json"},
            "multiValueHeaders": {}, "queryStringParameters": query, "multiValueQueryStringParameters":
                {k: [v] for k, v in (query or {}).items()} or None,
            "pathParameters": None, "stageVariables": None, "isBase64Encoded": False,
            "body": body if isinstance(body, str) or body is None else json.dumps(body),
            "requestContext": {"httpMethod": method, "path": path, "stage": "prod", "requestId": "r1",
                               "identity": {"userArn": "arn:aws:iam::123456789012:user/tester"}},
        }
        response = module.handler(event, _Context("timelake-api"))
        return response["statusCode"], json.loads(response["body"]) if response.get("body") else None

    return call


def test_start_status_report_list(api, cloud: Cloud, readings):
    sensor_table(cloud.lake)
    _upload(readings(recent(5), days=1, devices=2), "src/a.parquet")
    code, started = api("POST", "/backfills", {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet",
                                               "job_id": "bf-api-1"})
    assert code == 202 and started["job_id"] == "bf-api-1" and started["execution_arn"].endswith(":bf-api-1")
    assert cloud.wait(started["execution_arn"])["status"] == "SUCCEEDED"
    code, status = api("GET", "/backfills/bf-api-1")
    assert code == 200 and status["phase"] == "published" and status["units_done"] == status["units_total"] == 1
    assert status["execution"]["status"] == "SUCCEEDED"
    code, report = api("GET", "/backfills/bf-api-1/report")
    assert code == 200 and report["rows_written"] == 48
    code, listed = api("GET", "/backfills", query={"table": "iot.sensor"})
    assert code == 200 and [j["job_id"] for j in listed] == ["bf-api-1"]
    code, again = api("POST", "/backfills", {"table": "iot.sensor", "source": "s3://x/y.parquet", "job_id": "bf-api-1"})
    assert code == 409 and "already exists" in again["message"]


def test_dry_run_through_the_api(api, cloud: Cloud, readings):
    sensor_table(cloud.lake)
    _upload(readings(recent(5), days=1, devices=2), "src/a.parquet")
    code, started = api("POST", "/backfills", {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet",
                                               "dry_run": True})
    assert code == 202
    execution = cloud.wait(started["execution_arn"])
    assert execution["status"] == "SUCCEEDED" and json.loads(execution["output"])["rows_in_source"] == 48


@pytest.mark.parametrize("body, field", [
    ({"source": "s3://b/k.parquet"}, "table"),
    ({"table": "iot.sensor", "source": "s3://b/k.parquet", "mode": "upsert"}, "mode"),
    ({"table": "iot.sensor", "source": "s3://b/k.parquet", "max_concurrency": 0}, "max_concurrency"),
    ({"table": "iot.sensor", "source": "s3://b/k.parquet", "surprise": 1}, "surprise"),
])
def test_schema_violations_name_the_field(api, body, field):
    code, error = api("POST", "/backfills", body)
    assert code == 422
    assert any(field in [str(p) for p in d["loc"]] for d in error["detail"]), error


def test_invalid_json_is_a_client_error(api):
    code, _ = api("POST", "/backfills", "{not json")
    assert 400 <= code < 500


def test_unknown_job_is_404(api):
    code, error = api("GET", "/backfills/bf-nope")
    assert code == 404 and "bf-nope" in error["message"]
    code, _ = api("GET", "/backfills/bf-nope/report")
    assert code == 404


def test_resume_a_failed_job(api, cloud: Cloud, readings):
    table = sensor_table(cloud.lake)
    rows = readings(recent(5), days=1, devices=2)
    boto3.client("s3").put_object(Bucket=BUCKET, Key="src/bad.parquet", Body=b"garbage")
    code, started = api("POST", "/backfills", {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet",
                                               "job_id": "bf-api-2"})
    assert cloud.wait(started["execution_arn"])["status"] == "FAILED"
    _upload(rows, "src/bad.parquet")
    code, resumed = api("POST", "/backfills/bf-api-2/resume")
    assert code == 202 and resumed["how"] == "new execution"  # it ended in the Fail state: a redrive reruns nothing
    assert cloud.wait(resumed["execution_arn"])["status"] == "SUCCEEDED"
    assert table.to_arrow().num_rows == rows.num_rows


def test_openapi_document_is_current():
    os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
    committed = (ROOT / "docs" / "openapi.json").read_text().strip()
    assert committed == _api_module().openapi().strip(), \
        "regenerate: .venv/bin/python functions/api/app.py > docs/openapi.json"


def test_cli_on_aws_runs_checks_and_resumes(cloud: Cloud, readings, monkeypatch):
    import subprocess
    import sys

    sensor_table(cloud.lake)
    _upload(readings(recent(5), days=1, devices=2), "src/a.parquet")
    monkeypatch.setenv("TIMELAKE_STATE_MACHINE_ARN", cloud.state_machine_arn)
    timelake = str(Path(sys.executable).parent / "timelake")

    def cli(*args: str) -> Any:
        done = subprocess.run([timelake, "backfill", *args, "--on", "aws", "--json"], capture_output=True, text=True,
                              env=os.environ.copy(), timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    boto3.client("s3").put_object(Bucket=BUCKET, Key="src/b.parquet", Body=b"garbage")
    started = cli("iot.sensor", "--from", f"s3://{BUCKET}/src/*.parquet")
    assert cloud.wait(started["execution_arn"])["status"] == "FAILED"
    status = cli("status", started["job_id"])
    assert status["phase"] == "failed" and status["execution"]["status"] == "FAILED" and "b.parquet" in status["error"]
    _upload(readings(recent(4), days=1, devices=2), "src/b.parquet")
    resumed = cli("resume", started["job_id"])
    assert resumed["how"] == "new execution"
    assert cloud.wait(resumed["execution_arn"])["status"] == "SUCCEEDED"
    assert cli("status", started["job_id"])["phase"] == "published"
    assert cli("resume", started["job_id"])["how"] == "nothing to do: published"
    assert cloud.lake.table("iot.sensor").to_arrow().num_rows == 96


def test_abort_through_the_api_removes_the_branch_and_staged_files(api, cloud: Cloud, readings):
    table = sensor_table(cloud.lake)
    _upload(readings(recent(5), days=2, devices=2), "src/a.parquet")
    code, started = api("POST", "/backfills", {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet",
                                               "job_id": "bf-api-abort", "assertions": ["SELECT * FROM staged"]})
    assert cloud.wait(started["execution_arn"])["status"] == "FAILED"  # the assertion fails: staged, not published
    assert "backfill/bf-api-abort" in table.refresh().iceberg.metadata.refs
    staged = [u.result["path"] for u in cloud.lake.runtime.store.units("bf-api-abort")]
    code, aborted = api("POST", "/backfills/bf-api-abort/abort")
    assert code == 200 and aborted["phase"] == "aborted" and aborted["files_deleted"] == len(staged) == 2
    assert "backfill/bf-api-abort" not in table.refresh().iceberg.metadata.refs
    s3 = boto3.client("s3")
    for path in staged:
        bucket, _, key = path.removeprefix("s3://").partition("/")
        assert s3.list_objects_v2(Bucket=bucket, Prefix=key)["KeyCount"] == 0
    assert table.to_arrow().num_rows == 0
    code, again = api("POST", "/backfills/bf-api-abort/resume")
    assert code == 409 and "aborted" in again["message"]


def test_coverage_of_a_table_through_the_api(api, cloud: Cloud, readings):
    """Two days published by the workflow, a gap day between them: rows per day equal DuckDB's count
    over the table, the writer is the job, the gap is a gap; bad requests name their problem."""
    import duckdb

    table = sensor_table(cloud.lake)
    _upload(readings(recent(6), days=1, devices=2), "src/a.parquet")
    _upload(readings(recent(4), days=1, devices=2), "src/b.parquet")
    code, started = api("POST", "/backfills", {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet",
                                               "job_id": "bf-api-cov"})
    assert cloud.wait(started["execution_arn"])["status"] == "SUCCEEDED"
    code, cov = api("GET", "/tables/iot.sensor/coverage", query={"start": recent(6), "end": recent(3), "by": "day"})
    assert code == 200, cov
    rows = table.refresh().to_arrow()  # noqa: F841 (read by DuckDB by name)
    expected = dict(duckdb.sql("SELECT strftime(ts AT TIME ZONE 'UTC', '%Y-%m-%d'), count(*) FROM rows GROUP BY 1").fetchall())
    by_day = {b["bucket"]: b for b in cov["buckets"]}
    assert list(by_day) == [recent(6), recent(5), recent(4)]
    assert {d: b["rows"] for d, b in by_day.items() if b["rows"]} == expected
    assert by_day[recent(5)]["status"] == "gap" and by_day[recent(5)]["rows"] == 0
    assert by_day[recent(6)]["last_writer"] == by_day[recent(4)]["last_writer"] == "bf-api-cov"
    code, error = api("GET", "/tables/iot.nope/coverage")
    assert code == 404 and "iot.nope" in error["message"]
    code, error = api("GET", "/tables/iot.sensor/coverage", query={"start": recent(3), "end": recent(6)})
    assert code == 400 and "is not before --end" in error["message"]
    code, error = api("GET", "/tables/iot.sensor/coverage", query={"by": "week"})
    assert code == 422 and any("by" in [str(p) for p in d["loc"]] for d in error["detail"]), error
