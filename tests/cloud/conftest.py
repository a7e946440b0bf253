"""A deployment on moto: S3, DynamoDB, Glue, EventBridge and the real workflow file executed by
moto's Step Functions engine, whose Lambda tasks are dispatched to the real handlers: in the test
process (``cloud``), or in worker processes (``cloud_workers``, for jobs of thousands of units)."""

from __future__ import annotations

import concurrent.futures as cf
import gc
import io
import json
import os
import threading
import time
import urllib.request
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.awslambda_simple.models import LambdaSimpleBackend

import timelake
from tests.aws_fixtures import aws, dynamo_table, moto_server  # noqa: F401
from timelake.adapters import compose
from timelake.interfaces.lake import Lake
from timelake.ports.runtime import LakeConfig
from tests.cloud.workers import Context, load_function, run_handler, worker_context, worker_init  # noqa: F401 (used by the tests)

ROOT = Path(__file__).parents[2]
FUNCTIONS = ("plan", "scan", "cut", "write", "stage", "validate", "validate_item", "publish", "record_failure", "canary", "abort")
BUCKET, JOBS, BUS = "timelake-lake", "timelake-jobs", "timelake-backfill"


_Context = Context


@dataclass
class Cloud:
    endpoint: str
    sfn: Any
    state_machine_arn: str
    lake: Lake
    config: LakeConfig
    invocations: list[str]
    # function name → called with each event before the handler; raising fails that invocation
    before: dict[str, Any] = field(default_factory=dict)
    # function name → the most invocations of it that ran at once
    peaks: Counter[str] = field(default_factory=Counter)

    def run(self, job: dict[str, Any], name: str, timeout: float = 120) -> dict[str, Any]:
        """Start an execution named ``name`` and wait for its end."""
        return run_execution(self.sfn, self.state_machine_arn, job, name, timeout)

    def wait(self, arn: str, timeout: float = 120) -> dict[str, Any]:
        return wait_execution(self.sfn, arn, timeout)


def run_execution(sfn: Any, state_machine_arn: str, job: dict[str, Any], name: str, timeout: float) -> dict[str, Any]:
    """Start an execution of ``job`` named ``name`` and wait for its end."""
    arn = sfn.start_execution(stateMachineArn=state_machine_arn, name=name, input=json.dumps(job))["executionArn"]
    return wait_execution(sfn, arn, timeout)


def wait_execution(sfn: Any, arn: str, timeout: float) -> dict[str, Any]:
    """Polls quickly at first (most test executions take a second or two), then every second, so a
    long execution is not slowed by the server answering its own poll."""
    deadline, pause = time.time() + timeout, 0.1
    while time.time() < deadline:
        described = sfn.describe_execution(executionArn=arn)
        if described["status"] != "RUNNING":
            return described
        time.sleep(pause)
        pause = min(1.0, pause * 1.2)
    raise TimeoutError(f"execution {arn} still running after {timeout} s")


Dispatch = Callable[[str, bytes], tuple[str, bool]]  # function name, event → the handler's JSON answer, whether it raised


@pytest.fixture
def cloud(aws: str, monkeypatch: pytest.MonkeyPatch) -> Cloud:  # noqa: F811
    """Every handler runs in the test process, in the Step Functions engine's thread that invokes it."""
    return _deploy(aws, monkeypatch, lambda name, body: run_handler(name.removeprefix("timelake-"), body))


@pytest.fixture
def cloud_workers(aws: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:  # noqa: F811
    """Every handler runs in one of ``WORKERS`` worker processes, as warm Lambda containers would: the
    moto server and the Step Functions engine keep the test process, so both cores work, and the
    handlers' Python no longer competes with the server's for one interpreter lock. The workers are
    forked from a fork server that has the handlers' libraries imported, and serve every invocation of the test."""
    pool: cf.ProcessPoolExecutor | None = None

    def in_worker(name: str, body: bytes) -> tuple[str, bool]:
        return pool.submit(run_handler, name.removeprefix("timelake-"), body).result()

    cloud = _deploy(aws, monkeypatch, in_worker)
    pool = cf.ProcessPoolExecutor(WORKERS, mp_context=worker_context(),
                                  initializer=worker_init, initargs=(dict(os.environ),))
    thresholds = gc.get_threshold()
    gc.freeze()  # what the test process holds so far is never collected: no full collection walks it
    gc.set_threshold(thresholds[0], thresholds[1], 100)  # and moto's growing state is walked ten times less often
    try:
        yield cloud
    finally:
        pool.shutdown(cancel_futures=True)
        gc.set_threshold(*thresholds)
        gc.unfreeze()


WORKERS = 2


def _deploy(aws: str, monkeypatch: pytest.MonkeyPatch, dispatch: Dispatch) -> Cloud:  # noqa: F811
    for path, body in (("config", {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}),):
        request = urllib.request.Request(f"{aws}/moto-api/{path}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).close()
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    dynamo_table(JOBS)
    events = boto3.client("events")
    events.create_event_bus(Name=BUS)
    config = LakeConfig(
        catalog_name="glue",
        catalog_props={"type": "glue", "warehouse": f"s3://{BUCKET}/warehouse", "glue.endpoint": aws,
                       "glue.region": "us-east-1", "glue.access-key-id": "testing", "glue.secret-access-key": "testing",
                       "s3.endpoint": aws, "s3.region": "us-east-1", "s3.access-key-id": "testing",
                       "s3.secret-access-key": "testing"},
        store=f"dynamodb://{JOBS}", staging=f"s3://{BUCKET}/_backfill", events=f"eventbridge://{BUS}",
        scan_writes=False,  # as the stack deploys it: only the write Lambdas put data files
    )
    monkeypatch.setenv("TIMELAKE_CONFIG", config.model_dump_json())
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "timelake-backfill")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "Timelake")

    invocations: list[str] = []
    before: dict[str, Any] = {}
    running: Counter[str] = Counter()
    peaks: Counter[str] = Counter()
    counting = threading.Lock()

    def invoke(self: Any, function_name: str, qualifier: Any, body: Any, headers: Any, response_headers: Any) -> bytes:
        name = function_name.rsplit(":", 1)[-1]
        invocations.append(name)
        event = body if isinstance(body, bytes) else (body or "").encode()
        if name in before:
            try:
                before[name](json.loads(event) if event else {})
            except Exception as exc:
                response_headers["x-amz-function-error"] = "Unhandled"
                return json.dumps({"errorType": type(exc).__name__, "errorMessage": str(exc)}).encode()
        with counting:
            running[name] += 1
            peaks[name] = max(peaks[name], running[name])
        try:
            answer, failed = dispatch(name, event)
        finally:
            with counting:
                running[name] -= 1
        if failed:
            response_headers["x-amz-function-error"] = "Unhandled"
        return answer.encode()

    monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
    arns = _create_functions([f"timelake-{name}" for name in FUNCTIONS])
    definition = (ROOT / "statemachine" / "backfill.asl.json").read_text()
    for name, arn in arns.items():
        key = "".join(part.title() for part in name.removeprefix("timelake-").split("_")) + "FunctionArn"
        definition = definition.replace("${" + key + "}", arn)
    definition = definition.replace("${StagingBucket}", BUCKET)
    assert "${" not in definition
    sfn = boto3.client("stepfunctions")
    role = "arn:aws:iam::123456789012:role/timelake-states"
    arn = sfn.create_state_machine(name="timelake-backfill", definition=definition, roleArn=role)["stateMachineArn"]
    lake = Lake(compose(config))
    lake.catalog.create_namespace("iot")
    return Cloud(aws, sfn, arn, lake, config, invocations, before, peaks)


def _create_functions(names: list[str]) -> dict[str, str]:
    iam = boto3.client("iam")
    role = iam.create_role(RoleName="timelake-lambda", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
                                                "Action": "sts:AssumeRole"}]}))["Role"]["Arn"]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "def handler(event, context):\n    return event\n")
    client = boto3.client("lambda")
    return {name: client.create_function(FunctionName=name, Runtime="python3.12", Role=role, Handler="app.handler",
                                         Code={"ZipFile": buffer.getvalue()})["FunctionArn"] for name in names}


def sensor_table(lake: Lake) -> timelake.Table:
    from tests.conftest import SCHEMA

    return lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                             partition_by="day", retention="P3Y")
