"""Bodies the API refuses before reading a field: 413 for one over 1 MiB, 400 for bytes that are not
UTF-8, through the Lambda handler with API Gateway proxy events; no job is started for either."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests.cloud.conftest import Cloud, _Context, load_function, sensor_table
from timelake.model.spec import MAX_DOCUMENT_BYTES


def _event(method: str, body: str | None, is_base64: bool = False, query: dict[str, str] | None = None) -> dict[str, Any]:
    return {"resource": "/backfills", "path": "/backfills", "httpMethod": method,
            "headers": {"Content-Type": "application/json"}, "multiValueHeaders": {},
            "queryStringParameters": query, "multiValueQueryStringParameters": {k: [v] for k, v in (query or {}).items()} or None,
            "pathParameters": None, "stageVariables": None, "isBase64Encoded": is_base64, "body": body,
            "requestContext": {"httpMethod": method, "path": "/backfills", "stage": "prod", "requestId": "r1",
                               "identity": {"userArn": "arn:aws:iam::123456789012:user/tester"}}}


@pytest.fixture
def api(cloud: Cloud, monkeypatch):
    monkeypatch.setenv("STATE_MACHINE_ARN", cloud.state_machine_arn)
    sensor_table(cloud.lake)
    module = load_function("api")

    def call(event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        response = module.handler(event, _Context("timelake-api"))
        return response["statusCode"], json.loads(response["body"])

    yield call
    assert call(_event("GET", None, query={"table": "iot.sensor"})) == (200, [])  # nothing was started


def _job(padding: int) -> str:
    return json.dumps({"table": "iot.sensor", "source": "s3://bucket/src/*.parquet", "description": "x" * padding})


@pytest.mark.parametrize("is_base64", [False, True], ids=["text", "base64"])
def test_a_body_over_one_mib_is_413(api, is_base64):
    body = _job(MAX_DOCUMENT_BYTES)
    code, answer = api(_event("POST", base64.b64encode(body.encode()).decode() if is_base64 else body, is_base64))
    assert code == 413 and f"at most {MAX_DOCUMENT_BYTES:,}" in answer["message"]


def test_a_body_just_under_one_mib_is_read(api):
    body = _job(0)
    body = _job(MAX_DOCUMENT_BYTES - len(body) - 100)
    code, answer = api(_event("POST", body))
    assert code == 422 and answer["detail"][0]["loc"] == ["body", "description"]  # read, then refused on its fields


@pytest.mark.parametrize("raw", [b'{"table": "iot.\xff", "source": "s3://b/k"}', b"\xc3\x28", b'{"table": "\xed\xa0\x80"}'],
                         ids=["invalid byte", "broken sequence", "surrogate"])
def test_bytes_that_are_not_utf8_are_400(api, raw):
    code, answer = api(_event("POST", base64.b64encode(raw).decode(), is_base64=True))
    assert code == 400 and "UTF-8" in answer["message"]


def test_a_lone_surrogate_in_a_text_body_is_400(api):
    code, answer = api(_event("POST", '{"table": "iot.sensor", "source": "\ud800"}'))
    assert code == 400 and "UTF-8" in answer["message"]
