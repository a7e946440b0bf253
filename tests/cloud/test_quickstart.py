"""The deploy quickstart in docs/aws.md works as pasted: its blocks marked ``<!-- run on moto -->``
run, as one shell script in one shell (variables carry over, as in the reader's terminal), against
moto with the real workflow and handlers (`cloud`, dispatched in this process).

What cannot run here, and stands in for it:

- Steps 1 and 2 (credentials and region, ``cdk bootstrap``, ``cdk deploy``) need an AWS account and
  the cdk CLI's deployment; they are not marked to run. The test deploys as `cloud` does and makes a
  CloudFormation stack of the stack's name in moto whose outputs point at that deployment; every
  output the script reads must be an output of the synthesized stack, so the doc cannot ask for one
  the real stack lacks. The AWS CLI and ``timelake`` reach moto through ``AWS_ENDPOINT_URL`` (the
  commands stay as a reader types them), with moto's credentials and region.
- API Gateway has no invocation in moto: ``ApiUrl`` points at a stand-in here that checks the
  request's SigV4 signature (service ``execute-api``, the caller's credentials and region) and hands
  it, as API Gateway's proxy event, to the real API handler.
The script makes its own bucket (named after the account) and export (``examples/make_export.py``),
and names its job after the time, as a reader's second run would need.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from infra.app import STACK_NAME
from tests.cloud.conftest import ROOT, Cloud, _Context, load_function
from tests.docs.test_examples import runnable_blocks
from tests.infra.conftest import Synthesized, synthesized  # noqa: F401

MARK = "<!-- run on moto -->"


def quickstart_script() -> str:
    blocks = runnable_blocks(ROOT / "docs" / "aws.md", MARK)
    assert blocks and all(b.language == "bash" for b in blocks), "the quickstart's runnable blocks are bash"
    return "\n".join(b.code for b in blocks)


class _ApiGateway(ThreadingHTTPServer):
    """Stands in for the REST API: a SigV4-signed request for ``execute-api`` becomes a proxy event for
    the real API handler; an unsigned or wrongly signed one gets 403, as from API Gateway."""

    def __init__(self, credentials: Credentials, region: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forward)
        self.credentials, self.region, self.api = credentials, region, load_function("api")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/prod/"


class _Forward(BaseHTTPRequestHandler):
    server: _ApiGateway

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self._signed():
            self._answer(403, {"message": "Missing or invalid SigV4 signature for execute-api"})
            return
        path = self.path.removeprefix("/prod")
        event = {"resource": path, "path": path, "httpMethod": "GET", "headers": dict(self.headers),
                 "multiValueHeaders": {}, "queryStringParameters": None, "multiValueQueryStringParameters": None,
                 "pathParameters": None, "stageVariables": None, "isBase64Encoded": False, "body": None,
                 "requestContext": {"httpMethod": "GET", "path": path, "stage": "prod", "requestId": "quickstart",
                                    "identity": {"userArn": "arn:aws:iam::123456789012:user/quickstart"}}}
        answer = self.server.api.handler(event, _Context("timelake-api"))
        self._answer(answer["statusCode"], json.loads(answer["body"]))

    def _signed(self) -> bool:
        """Recompute the signature the way API Gateway checks it: the signed headers as received, the
        request's own timestamp, the credentials and region this deployment expects."""
        found = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
                             r"SignedHeaders=([^,]+), Signature=([0-9a-f]+)", self.headers.get("Authorization", ""))
        if not found or found[1] != self.server.credentials.access_key or (found[3], found[4]) != (self.server.region, "execute-api"):
            return False
        signed = {name: self.headers[name] for name in found[5].split(";")}
        request = AWSRequest("GET", f"http://{self.headers['host']}{self.path}", headers=signed)
        request.context["timestamp"] = self.headers["x-amz-date"]
        auth = SigV4Auth(self.server.credentials, "execute-api", self.server.region)
        return auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request) == found[6]

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_gateway(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[_ApiGateway]:
    monkeypatch.setenv("STATE_MACHINE_ARN", cloud.state_machine_arn)
    session = boto3.Session()
    server = _ApiGateway(session.get_credentials().get_frozen_credentials(), session.region_name)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join()


def _deploy_stand_in(cloud: Cloud, api_url: str, synth: Synthesized) -> dict[str, str]:
    """What ``cdk deploy`` leaves behind, as far as the quickstart uses it: the stack's outputs."""
    outputs = {"StateMachineArn": cloud.state_machine_arn, "ApiUrl": api_url, "BucketName": "timelake-lake",
               "LakeConfig": cloud.config.model_dump_json()}
    assert set(outputs) <= set(synth.template["Outputs"]), "the stand-in has outputs the real stack lacks"
    template = {"Resources": {"Deployed": {"Type": "AWS::SQS::Queue"}},
                "Outputs": {name: {"Value": value} for name, value in outputs.items()}}
    boto3.client("cloudformation").create_stack(StackName=STACK_NAME, TemplateBody=json.dumps(template))
    return outputs


def test_the_deploy_quickstart_runs_as_pasted(cloud: Cloud, api_gateway: _ApiGateway, synthesized: Synthesized,  # noqa: F811
                                              tmp_path: Path) -> None:
    script = quickstart_script()
    outputs = _deploy_stand_in(cloud, api_gateway.url, synthesized)
    assert {"StateMachineArn", "ApiUrl", "BucketName"} <= set(re.findall(r"\$\(output (\w+)\)", script)) <= set(outputs)
    assert f"--stack-name {STACK_NAME} " in script
    (tmp_path / "examples").mkdir()
    for name in ("job.json", "make_export.py"):
        shutil.copy(ROOT / "examples" / name, tmp_path / "examples" / name)

    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMELAKE_")} | {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TIMELAKE_S3_ENDPOINT": os.environ["TIMELAKE_S3_ENDPOINT"],
        "PYTHONPATH": os.pathsep.join([str(ROOT / "layers"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"the quickstart failed:\n{done.stdout}\n{done.stderr}"

    started, answer = _json_objects(done.stdout)
    job = started["executionArn"].rsplit(":", 1)[1]
    assert re.fullmatch(r"bf-2024-reprocess-\d{8}-\d{6}", job)
    execution = cloud.wait(started["executionArn"])
    assert execution["status"] == "SUCCEEDED", execution
    rows = sum(pq.read_metadata(path).num_rows for path in (tmp_path / "export").glob("*.parquet"))
    assert rows == 144 and boto3.client("s3").list_objects_v2(Bucket="old-historian-123456789012")["KeyCount"] == 3
    lines = done.stdout.splitlines()
    assert lines[0] == f"state machine: {outputs['StateMachineArn']}, API: {outputs['ApiUrl']}, lake: s3://timelake-lake"
    assert re.fullmatch(rf"{job} published; (\d+)/\1 units, {rows}/{rows} rows.* \[execution (RUNNING|SUCCEEDED)\]", lines[-1]), lines[-1]
    assert (answer["job_id"], answer["phase"]) == (job, "published") and answer["units_done"] == answer["units_total"] > 0
    assert cloud.lake.table("iot.sensor").iceberg.scan().to_arrow().num_rows == rows
    assert "created iot.sensor" in done.stdout


def _json_objects(text: str) -> list[dict[str, object]]:
    """The JSON objects printed in ``text`` (each starts a line), in order."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) >= 0:
        if at == 0 or text[at - 1] == "\n":
            value, end = decoder.raw_decode(text, at)
            found.append(value)
            at = end
        else:
            at += 1
    return found
