"""What runs inside a worker process in the cloud tests: the handlers, with the environment of a
Lambda (in the least-privilege test, the credentials of one function's role). Kept light to import
(no CDK, no moto), since each worker process imports it."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import time
import traceback
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).parents[2]


def load_function(name: str) -> Any:
    """The module of ``functions/<name>/app.py`` (every handler file is named app.py)."""
    spec = importlib.util.spec_from_file_location(f"fn_{name}", ROOT / "functions" / name / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Context:
    """What Powertools reads from a Lambda context."""

    def __init__(self, name: str) -> None:
        self.function_name = name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{name}"
        self.memory_limit_in_mb = 3008
        self.aws_request_id = f"req-{time.monotonic_ns()}"
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "test"

    def get_remaining_time_in_millis(self) -> int:
        return 900_000


# What every handler imports, loaded once in the fork server, not again in each worker: a spawned worker
# spent about 1.3 s of CPU importing these before its first invocation. Only libraries: none of them
# reads the environment or credentials on import (the handlers' modules, which create their Logger and
# clients, are loaded in the worker after `worker_init` has set its environment).
PRELOAD = ["json", "boto3", "botocore.session", "pyarrow", "pyarrow.parquet", "pyarrow.compute", "pydantic",
           "aws_lambda_powertools", "aws_lambda_powertools.metrics", "aws_lambda_powertools.utilities.typing",
           "timelake.interfaces.service", "timelake.steps.plan", "timelake.steps.write", "timelake.steps.diff",
           "timelake.steps.stage", "timelake.steps.validate", "timelake.steps.publish", "timelake.steps.abort",
           "timelake.model.spec", "tests.cloud.workers"]


def worker_context() -> multiprocessing.context.BaseContext:
    """Worker processes forked from a fork server that has imported `PRELOAD` (never from the test
    process, whose moto threads a fork would copy mid-request); each worker is still a process of its
    own with only the environment `worker_init` gives it."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def worker_init(env: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)


_HANDLERS: dict[str, Any] = {}


def run_handler(name: str, body: bytes) -> tuple[str, bool]:
    """In the function's worker process: the handler's JSON answer, and whether it raised."""
    if name not in _HANDLERS:
        _HANDLERS[name] = load_function(name).handler
    try:
        return json.dumps(_HANDLERS[name](json.loads(body) if body else {}, Context(f"timelake-{name}"))), False
    except Exception as exc:
        return json.dumps({"errorType": type(exc).__name__, "errorMessage": str(exc),
                           "stackTrace": traceback.format_tb(exc.__traceback__)}), True


def try_outside_role(kind: str) -> str:
    """In a worker process: one call its role must not allow; returns the error it got."""
    from timelake.adapters.objects import filesystem

    try:
        if kind == "put-data-file":
            fs, path = filesystem(f"s3://{os.environ['TIMELAKE_TEST_BUCKET']}/warehouse/iot.db/sensor/data/ts_day=2024-12-02/forged.parquet")
            with fs.open_output_stream(path) as out:
                out.write(b"PAR1")
        elif kind in ("put-scratch-file", "put-facts-file"):
            folder = "validate/" if kind == "put-facts-file" else ""
            fs, path = filesystem(f"s3://{os.environ['TIMELAKE_TEST_BUCKET']}/_backfill/forged/{folder}pending-units.json")
            with fs.open_output_stream(path) as out:
                out.write(b"[]")
        elif kind == "delete-data-file":
            key = boto3.client("s3").list_objects_v2(Bucket=os.environ['TIMELAKE_TEST_BUCKET'], Prefix="warehouse/iot.db/sensor/data/")["Contents"][0]["Key"]
            boto3.client("s3").delete_object(Bucket=os.environ['TIMELAKE_TEST_BUCKET'], Key=key)
        elif kind == "glue-commit":
            table = boto3.client("glue").get_table(DatabaseName="iot", Name="sensor")["Table"]
            boto3.client("glue").update_table(DatabaseName="iot", TableInput={"Name": "sensor", "Parameters": table["Parameters"]})
        elif kind == "other-database":
            boto3.client("glue").get_tables(DatabaseName="finance")
    except Exception as exc:  # noqa: BLE001 (the error is the answer)
        return f"{type(exc).__name__}: {exc}"
    return "allowed"
