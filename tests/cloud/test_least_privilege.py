"""Least privilege, proven: the README example runs on moto with IAM enforced, every handler with
the credentials of its own role, built from the synthesized template's policies.

Each function's role and inline policies are created in moto IAM from the template (intrinsics
resolved to the moto names), assumed through moto STS, and each handler runs in its own worker
process with only those credentials, as a Lambda would. moto enforces IAM once
``INITIAL_NO_AUTH_ACTION_COUNT`` is reached (here: set to 0 after the setup). The Step Functions
engine itself calls Lambda and S3 with the state machine role's credentials.

moto checks S3 requests against object and bucket ARNs, but every other service against resource
``*``; the `_RESOURCES` functions give Lambda, Glue, DynamoDB and EventBridge requests the ARN that
AWS evaluates (the most specific one of the request), so a grant on the wrong Glue database is
denied here as it would be in an account.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

import boto3
import moto.settings
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto.awslambda.responses import LambdaResponse
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.dynamodb.responses import DynamoHandler
from moto.events.responses import EventsHandler
from moto.glue.responses import GlueResponse
from moto.iam.access_control import IAMRequestBase
from moto.s3.responses import S3Response
from moto.stepfunctions.parser.asl.component.state.exec.state_map.item_reader.eval import resource_eval_s3 as item_reader
from moto.stepfunctions.parser.asl.component.state.exec.state_map.result_writer.resource_eval import (
    resource_eval_s3 as result_writer,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

from infra.stack import FUNCTIONS, WORKFLOW_FUNCTIONS
from tests.aws_fixtures import aws, dynamo_table, moto_server  # noqa: F401
from tests.cloud.conftest import BUCKET, BUS, JOBS, ROOT, run_execution
from tests.cloud.workers import run_handler, try_outside_role, worker_context, worker_init
from tests.infra.conftest import Synthesized, synthesized  # noqa: F401
from timelake.adapters import compose
from timelake.interfaces.lake import Lake
from timelake.ports.runtime import LakeConfig

ACCOUNT, REGION = "123456789012", "us-east-1"
SOURCE_BUCKET = "old-historian"
EXAMPLE = json.loads((ROOT / "examples" / "job.json").read_text())


def _arn(service: str, resource: str) -> str:
    return f"arn:aws:{service}:{REGION}:{ACCOUNT}:{resource}"


def _lambda_resource(self: Any) -> str:
    if "/functions/" in self.path:
        return _arn("lambda", "function:" + unquote(self.path.split("/functions/")[1].split("/")[0]).split(":")[-1])
    return "*"


def _body(self: Any) -> dict[str, Any]:
    if isinstance(self.body, dict):  # DynamoDB's handler has parsed it already
        return self.body
    try:
        return json.loads(self.body or "{}")
    except ValueError:
        return {}


def _glue_resource(self: Any) -> str:
    body, action = _body(self), self._get_action()
    if "DatabaseName" in body:
        name = body.get("Name") or body.get("TableInput", {}).get("Name")
        return _arn("glue", f"table/{body['DatabaseName']}/{name}") if name else _arn("glue", f"database/{body['DatabaseName']}")
    if action in ("GetDatabase", "DeleteDatabase") and "Name" in body:
        return _arn("glue", f"database/{body['Name']}")
    return _arn("glue", "catalog")


def _dynamodb_resource(self: Any) -> str:
    body = _body(self)
    table = body.get("TableName") or next(iter(body.get("RequestItems", {})), None)
    if not table and body.get("TransactItems"):
        table = next(iter(body["TransactItems"][0].values()))["TableName"]
    if not table:
        return "*"
    return _arn("dynamodb", f"table/{table}" + (f"/index/{body['IndexName']}" if body.get("IndexName") else ""))


def _events_resource(self: Any) -> str:
    entries = _body(self).get("Entries") or [{}]
    return _arn("events", f"event-bus/{entries[0].get('EventBusName', 'default')}")


# moto names some requests by their API operation where IAM names the permission differently; from moto
# 5.2.6 on every S3 request is named by its operation (HeadObject, ListObjectsV2, UploadPart, ...), which
# AWS authorizes as the permissions below.
_IAM_ACTIONS = {"lambda:Invoke": "lambda:InvokeFunction", "s3:HeadBucket": "s3:ListBucket",
                "s3:HeadObject": "s3:GetObject", "s3:GetObjectAttributes": "s3:GetObject",
                "s3:ListObjects": "s3:ListBucket", "s3:ListObjectsV2": "s3:ListBucket",
                "s3:ListObjectVersions": "s3:ListBucketVersions", "s3:DeleteObjects": "s3:DeleteObject",
                "s3:CreateMultipartUpload": "s3:PutObject", "s3:UploadPart": "s3:PutObject",
                "s3:CompleteMultipartUpload": "s3:PutObject", "s3:CopyObject": "s3:PutObject",
                "s3:ListMultipartUploads": "s3:ListBucketMultipartUploads", "s3:ListParts": "s3:ListMultipartUploadParts"}


def _iam_action_names(init: Callable[..., None]) -> Callable[..., None]:
    def named(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._action = _IAM_ACTIONS.get(self._action, self._action)
    return named


def _delete_keys_per_key(delete_keys: Callable[..., Any]) -> Callable[..., Any]:
    """moto checks DeleteObjects against the bucket's ARN; AWS checks s3:DeleteObject on each key.
    Evaluate each key as AWS does: delete if every key is allowed, else deny them all."""
    import xmltodict

    def delete(self: Any, bucket_name: str, authenticated: bool = True) -> Any:
        if authenticated:
            return delete_keys(self, bucket_name, authenticated)
        objects = xmltodict.parse(self.body)["Delete"].get("Object", [])
        try:
            for obj in objects if isinstance(objects, list) else [objects]:
                self._authenticate_and_authorize_s3_action(bucket_name=bucket_name, key_name=obj["Key"])
        except Exception:  # noqa: BLE001 (denied: moto's unauthenticated path reports each key as denied)
            return delete_keys(self, bucket_name, False)
        return delete_keys(self, bucket_name, True)
    return delete


_RESOURCES = {LambdaResponse: _lambda_resource, GlueResponse: _glue_resource, DynamoHandler: _dynamodb_resource,
              EventsHandler: _events_resource}


def _resolver(synth: Synthesized, names: dict[str, str], arns: dict[str, str]) -> Callable[[Any], Any]:
    """Resolves the template's intrinsics to moto's names: ``Ref`` → ``names``, ``GetAtt X.Arn`` → ``arns``."""
    pseudo = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::URLSuffix": "amazonaws.com"}

    def resolve(value: Any) -> Any:
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "Ref" in value:
            return pseudo.get(value["Ref"]) or names.get(value["Ref"], f"arn:aws:unresolved:{REGION}:{ACCOUNT}:{value['Ref']}")
        if "Fn::GetAtt" in value:
            logical, attribute = value["Fn::GetAtt"]
            return arns.get(logical, f"arn:aws:unresolved:{REGION}:{ACCOUNT}:{logical}.{attribute}")
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return separator.join(str(resolve(p)) for p in parts)
        return {k: resolve(v) for k, v in value.items()}

    return resolve


def _role_policies(synth: Synthesized, role: str, resolve: Callable[[Any], Any]) -> list[dict[str, Any]]:
    return [resolve(p["Properties"]["PolicyDocument"]) for p in synth.resources("AWS::IAM::Policy").values()
            if {"Ref": role} in p["Properties"].get("Roles", [])]


class Deployment:
    """The moto deployment: one worker process per function, with that function's credentials."""

    def __init__(self, pools: dict[str, cf.ProcessPoolExecutor], sfn: Any, arn: str, lake: Lake) -> None:
        self.pools, self.sfn, self.state_machine_arn, self.lake = pools, sfn, arn, lake
        self.invocations: list[str] = []

    def run(self, job: dict[str, Any], name: str, timeout: float = 300) -> dict[str, Any]:
        return run_execution(self.sfn, self.state_machine_arn, job, name, timeout)

    def as_role(self, function: str, kind: str) -> str:
        return self.pools[function].submit(try_outside_role, kind).result(timeout=120)


@pytest.fixture
def deployment(aws: str, synthesized: Synthesized, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:  # noqa: F811
    import urllib.request

    body = json.dumps({"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{aws}/moto-api/config", data=body, method="POST",
                                                  headers={"Content-Type": "application/json"}), timeout=10).close()
    s3 = boto3.client("s3")
    for bucket in (BUCKET, SOURCE_BUCKET):
        s3.create_bucket(Bucket=bucket)
    dynamo_table(JOBS)
    boto3.client("events").create_event_bus(Name=BUS)
    for database in synthesized.resources("AWS::Glue::Database").values():  # the stack creates its databases
        boto3.client("glue").create_database(DatabaseInput={"Name": database["Properties"]["DatabaseInput"]["Name"]})

    fns = {r["Properties"]["Description"].removeprefix("timelake backfill: ").replace(" ", "_"): (logical, r["Properties"])
           for logical, r in synth_functions(synthesized)}
    (machine_id, machine), = synthesized.resources("AWS::StepFunctions::StateMachine").items()
    data = next(n for n, r in synthesized.resources("AWS::S3::Bucket").items() if "LoggingConfiguration" in r["Properties"])
    (table_id,) = synthesized.resources("AWS::DynamoDB::Table")
    (bus_id,) = synthesized.resources("AWS::Events::EventBus")
    machine_arn = _arn("states", "stateMachine:timelake-backfill")
    names = {data: BUCKET, table_id: JOBS, bus_id: BUS, machine_id: machine_arn,
             **{logical: f"timelake-{name}" for name, (logical, _) in fns.items()}}
    arns = {data: f"arn:aws:s3:::{BUCKET}", table_id: _arn("dynamodb", f"table/{JOBS}"), bus_id: _arn("events", f"event-bus/{BUS}"),
            **{logical: _arn("lambda", f"function:timelake-{name}") for name, (logical, _) in fns.items()}}
    resolve = _resolver(synthesized, names, arns)

    iam, sts = boto3.client("iam"), boto3.client("sts")
    trust = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": ["lambda.amazonaws.com", "states.amazonaws.com"]}, "Action": "sts:AssumeRole"}]})

    def role_credentials(name: str, role_logical_id: str) -> dict[str, str]:
        role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        for i, document in enumerate(_role_policies(synthesized, role_logical_id, resolve)):
            iam.put_role_policy(RoleName=name, PolicyName=f"p{i}", PolicyDocument=json.dumps(document))
        creds = sts.assume_role(RoleArn=role, RoleSessionName=name)["Credentials"]
        return {"AWS_ACCESS_KEY_ID": creds["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
                "AWS_SESSION_TOKEN": creds["SessionToken"]}

    credentials = {name: role_credentials(f"timelake-{name}", props["Role"]["Fn::GetAtt"][0]) for name, (_, props) in fns.items()}
    machine_credentials = role_credentials("timelake-states", machine["Properties"]["RoleArn"]["Fn::GetAtt"][0])

    # Like the deployed config: no keys, so every client takes the role's credentials from the environment.
    config = LakeConfig(catalog_name="glue", catalog_props={"type": "glue", "warehouse": f"s3://{BUCKET}/warehouse", "glue.endpoint": aws,
                                                            "glue.region": REGION, "s3.endpoint": aws, "s3.region": REGION},
                        store=f"dynamodb://{JOBS}", staging=f"s3://{BUCKET}/_backfill", events=f"eventbridge://{BUS}",
                        scan_writes=_deployed_scan_writes(fns))
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")}
    base_env |= {"TIMELAKE_TEST_BUCKET": BUCKET, "TIMELAKE_CONFIG": config.model_dump_json(), "POWERTOOLS_TRACE_DISABLED": "true", "POWERTOOLS_SERVICE_NAME": "timelake-backfill",
                 "POWERTOOLS_METRICS_NAMESPACE": "Timelake", "PYTHONPATH": f"{ROOT / 'layers'}{os.pathsep}{ROOT}",
                 "ABORT_FUNCTION_ARN": _arn("lambda", "function:timelake-abort"), "STATE_MACHINE_ARN": machine_arn}
    context = worker_context()
    pools = {name: cf.ProcessPoolExecutor(1, mp_context=context, initializer=worker_init, initargs=({**base_env, **credentials[name]},))
             for name in fns}

    def invoke(self: Any, function_name: str, qualifier: Any, body: Any, headers: Any, response_headers: Any) -> bytes:
        name = function_name.rsplit(":", 1)[-1].removeprefix("timelake-")
        deployment.invocations.append(name)
        answer, failed = pools[name].submit(run_handler, name, body if isinstance(body, bytes) else (body or "").encode()).result()
        if failed:
            response_headers["x-amz-function-error"] = "Unhandled"
        return answer.encode()

    monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
    lam = boto3.client("lambda")
    buffer = io.BytesIO()
    import zipfile

    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "def handler(event, context):\n    return event\n")
    for name in fns:
        lam.create_function(FunctionName=f"timelake-{name}", Runtime="python3.12", Role=f"arn:aws:iam::{ACCOUNT}:role/timelake-{name}",
                            Handler="app.handler", Code={"ZipFile": buffer.getvalue()})
    definition = json.loads(machine["Properties"]["DefinitionString"])
    text = json.dumps(definition)
    for key, value in machine["Properties"]["DefinitionSubstitutions"].items():
        text = text.replace("${" + key + "}", resolve(value))
    sfn_admin = boto3.client("stepfunctions")
    sfn_admin.create_state_machine(name="timelake-backfill", definition=text, roleArn=f"arn:aws:iam::{ACCOUNT}:role/timelake-states")

    # An operator with every right, for the test's own calls once IAM is enforced.
    iam.create_user(UserName="operator")
    iam.put_user_policy(UserName="operator", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="operator")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it caches the credentials it first found

    def engine_client(region: str, service: str, state_credentials: Any = None) -> Any:
        from botocore.config import Config

        return boto3.client(service, region_name=region, endpoint_url=aws, aws_access_key_id=machine_credentials["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=machine_credentials["AWS_SECRET_ACCESS_KEY"],
                            aws_session_token=machine_credentials["AWS_SESSION_TOKEN"],
                            config=Config(parameter_validation=False, retries={"max_attempts": 0, "total_max_attempts": 1}))

    for module in (item_reader, result_writer, lambda_eval_utils):
        monkeypatch.setattr(module, "boto_client_for", engine_client)
    monkeypatch.setattr(IAMRequestBase, "__init__", _iam_action_names(IAMRequestBase.__init__))
    monkeypatch.setattr(S3Response, "_bucket_response_delete_keys", _delete_keys_per_key(S3Response._bucket_response_delete_keys))
    for response, resource in _RESOURCES.items():
        monkeypatch.setattr(response, "_determine_resource", resource, raising=False)
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # IAM enforced from here on
    deployment = Deployment(pools, boto3.client("stepfunctions"), machine_arn, Lake(compose(config)))
    try:
        yield deployment
    finally:
        for pool in pools.values():
            pool.shutdown(cancel_futures=True)


def _deployed_scan_writes(fns: dict[str, tuple[str, dict[str, Any]]]) -> bool:
    """``scan_writes`` as the stack sets it in the scan function's TIMELAKE_CONFIG (a join of text and
    deploy-time tokens; the flag is in the text)."""
    value = fns["scan"][1]["Environment"]["Variables"]["TIMELAKE_CONFIG"]
    parts = value["Fn::Join"][1] if isinstance(value, dict) else [value]
    found = re.search(r'"scan_writes":\s*(true|false)', "".join(p for p in parts if isinstance(p, str)))
    assert found, "the stack's TIMELAKE_CONFIG has no scan_writes"
    return found[1] == "true"


def synth_functions(synth: Synthesized) -> list[tuple[str, dict[str, Any]]]:
    return list(synth.resources("AWS::Lambda::Function").items())


def _export(days: int) -> pa.Table:
    """The historian's export: naive local timestamps (Europe/Berlin), its own column names."""
    from datetime import datetime, timedelta

    import numpy as np

    start = datetime(2024, 12, 1)
    hours = days * 24
    stamps = [start + timedelta(hours=h) for h in range(hours)]
    return pa.table({"timestamp": pa.array(stamps * 2, pa.timestamp("us")), "tag_name": ["d00"] * hours + ["d01"] * hours,
                     "val": np.round(np.random.default_rng(3).uniform(0, 100, 2 * hours), 3)})


def _denied(error: str) -> bool:
    """botocore says AccessDenied, pyarrow says ACCESS_DENIED / Access Denied."""
    return "accessdenied" in error.replace(" ", "").replace("_", "").lower()


def test_the_readme_example_runs_with_each_function_on_its_own_role(deployment: Deployment) -> None:
    from tests.conftest import SCHEMA

    table = deployment.lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                                         partition_by="day", retention="P3Y")
    buffer = io.BytesIO()
    pq.write_table(_export(3), buffer)
    boto3.client("s3").put_object(Bucket=SOURCE_BUCKET, Key="export/part-0.parquet", Body=buffer.getvalue())

    result = deployment.run(EXAMPLE, "readme-example")
    assert result["status"] == "SUCCEEDED", result.get("cause")
    assert table.refresh().to_arrow().num_rows == 144
    assert deployment.lake.job("readme-example").report()["phase"] == "published"
    assert {"plan", "scan", "cut", "write", "stage", "validate", "validate_item", "publish"} <= set(deployment.invocations)
    files = deployment.lake.job("readme-example").report()["files"]
    assert deployment.invocations.count("validate_item") == files > 1  # one per staged file

    # A file per day with absolute times: embedded, each day's scan task would write its file itself; the
    # scan's role may not put data files, so on AWS every day is spilled for the write Lambdas.
    days = deployment.lake.create_table("iot.sensor_days", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                                        partition_by="day", retention="P3Y")
    export = _export(3)
    export = export.set_column(0, "timestamp", export.column("timestamp").cast(pa.timestamp("us", "UTC")))
    for day in range(3):
        buffer = io.BytesIO()
        pq.write_table(export.slice(day * 24, 24), buffer)
        boto3.client("s3").put_object(Bucket=SOURCE_BUCKET, Key=f"days/{day}.parquet", Body=buffer.getvalue())
    writes = deployment.invocations.count("write")
    job = {**{k: v for k, v in EXAMPLE.items() if k != "tz"}, "table": "iot.sensor_days",
           "source": f"s3://{SOURCE_BUCKET}/days/*.parquet"}
    result = deployment.run(job, "day-files")
    assert result["status"] == "SUCCEEDED", result.get("cause")
    assert days.refresh().to_arrow().num_rows == 72
    assert not any(u.info.get("direct") for u in deployment.lake.runtime.store.units("day-files"))
    assert deployment.invocations.count("write") - writes == 3

    # Positive controls: calls outside a role are denied, so the success above means something.
    assert _denied(deployment.as_role("validate", "put-data-file"))
    assert _denied(deployment.as_role("scan", "put-data-file"))
    assert _denied(deployment.as_role("write", "delete-data-file"))
    assert _denied(deployment.as_role("api", "delete-data-file"))
    assert _denied(deployment.as_role("validate", "glue-commit"))
    assert _denied(deployment.as_role("validate_item", "put-data-file"))
    assert _denied(deployment.as_role("validate_item", "put-scratch-file"))  # staging outside validate/
    assert _denied(deployment.as_role("validate_item", "delete-data-file"))
    assert _denied(deployment.as_role("validate_item", "glue-commit"))
    assert deployment.as_role("validate_item", "put-facts-file") == "allowed"
    assert _denied(deployment.as_role("plan", "other-database"))
    assert deployment.as_role("write", "put-data-file") == "allowed"  # the writer may put data files


def test_only_publish_abort_and_rollup_delete_lake_files(synthesized: Synthesized) -> None:  # noqa: F811
    """Static check of the same template: Delete only for publish, abort and rollup (and plan, on the
    job's own scratch files), Put on data files only for the writers, no Put/Delete for read-only steps."""
    fns = {r["Properties"]["Description"].removeprefix("timelake backfill: ").replace(" ", "_"): r["Properties"]
           for _, r in synth_functions(synthesized)}
    resolve = _resolver(synthesized, {}, {})
    for name, props in fns.items():
        granted: dict[str, list[str]] = {}
        for document in _role_policies(synthesized, props["Role"]["Fn::GetAtt"][0], resolve):
            for s in document["Statement"]:
                for action in [s["Action"]] if isinstance(s["Action"], str) else s["Action"]:
                    granted.setdefault(action, []).extend([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])
        deletes = [r.split("/", 1)[1] for r in granted.get("s3:DeleteObject", [])]
        puts = [r.split("/", 1)[1] for r in granted.get("s3:PutObject", [])]
        assert set(deletes) <= {"_backfill/*", "warehouse/*/data/*"}, name
        assert ("warehouse/*/data/*" in deletes) == (name in ("abort", "rollup")), name
        assert bool(deletes) == (name in ("plan", "publish", "abort", "rollup")), name
        assert ("warehouse/*/data/*" in puts) == (name in ("write", "rollup")), name
        if name in ("api", "record_failure"):
            assert not puts and not deletes, name
        if name in ("validate", "validate_item"):  # the check items and each file's facts, nothing else
            assert puts == ["_backfill/*/validate/*"] and not deletes, name
        if name in ("plan", "scan"):
            assert puts == ["_backfill/*"], name
        assert ("warehouse/*/metadata/*" in puts) == FUNCTIONS[name].commits, name
    assert set(WORKFLOW_FUNCTIONS) <= set(fns)
