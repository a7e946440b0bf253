"""AWS for tests: one moto server per test process, reset before each test that asks for it.

Use with ``from tests.aws_fixtures import moto_server, aws  # noqa: F401`` and take ``aws`` (the
endpoint URL) in a test. The server runs in a thread of the test process (under pytest-xdist one
per worker) and is shared: a module importing these fixtures gets its own fixture definition, so
the server is kept per process, not per definition. Clients find it through the standard
``AWS_ENDPOINT_URL``, which child processes inherit; pyarrow's S3 file system ignores that variable
and reads ``TIMELAKE_S3_ENDPOINT`` instead (see `timelake.adapters.objects.filesystem`).
"""

from __future__ import annotations

import functools
import logging
import threading
import urllib.request
from collections.abc import Iterator

import boto3
import pytest
from moto.dynamodb.responses import DynamoHandler
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from moto.server import ThreadedMotoServer

from timelake.aws.store import table_definition

_servers: dict[str, ThreadedMotoServer] = {}


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """The endpoint URL; AWS variables point at it for the session and are restored afterwards."""
    if not _servers:
        _serialize_dynamodb()
        _route_once_per_host()
        _one_engine_client_per_service()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        _servers[f"http://{host}:{port}"] = server
    endpoint = next(iter(_servers))
    with pytest.MonkeyPatch.context() as env:
        env.setattr(logging.getLogger("werkzeug"), "disabled", True)  # one log line per request drowns failures
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            env.delenv(name, raising=False)
        for name, value in {
            "AWS_ENDPOINT_URL": endpoint, "TIMELAKE_S3_ENDPOINT": endpoint, "MOTO_PORT": endpoint.rpartition(":")[2],
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            env.setenv(name, value)
        yield endpoint
    if endpoint in _servers:
        _servers.pop(endpoint).stop()


@pytest.fixture
def aws(moto_server: str) -> str:
    """The endpoint URL of an empty moto: state left by earlier tests is wiped first."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST"), timeout=10).close()
    return moto_server


def dynamo_table(name: str) -> str:
    """Create the job store table as the stack defines it; returns its name."""
    boto3.client("dynamodb").create_table(TableName=name, **table_definition())
    return name


@functools.cache
def _serialize_dynamodb() -> None:
    """One DynamoDB request at a time, once per process. Real DynamoDB applies each write atomically;
    moto's server runs requests on threads without a lock: its conditional writes check, then write,
    and concurrent TransactWriteItems fail with HTTP 500 (it deep-copies a table another thread is
    changing). Exactly-once tests need the atomicity they would get from DynamoDB."""
    lock = threading.Lock()
    dispatch = DynamoHandler.call_action

    def call_action(self: DynamoHandler) -> object:
        with lock:
            return dispatch(self)

    DynamoHandler.call_action = call_action


@functools.cache
def _route_once_per_host() -> None:
    """Find each host's backend once, not on every request. moto's server looks a request's service
    up by listing its own package folder (a directory read and ~250 ``isdir`` calls) and then
    matching ~300 URL patterns, under a lock: about a sixth of the server's time per request, which
    a job of thousands of units pays tens of thousands of times. The answer depends on the host
    alone, so it is kept."""
    lookup = DomainDispatcherApplication.get_backend_for_host
    known: dict[str | None, object] = {}

    def get_backend_for_host(self: DomainDispatcherApplication, host: str | None) -> object:
        if host not in known:
            known[host] = lookup(self, host)
        return known[host]

    DomainDispatcherApplication.get_backend_for_host = get_backend_for_host


@functools.cache
def _one_engine_client_per_service() -> None:
    """moto's Step Functions engine makes a new boto3 client for every Lambda task it runs (and for
    every ItemReader and ResultWriter call): about 30 ms of CPU each, half of the server process's
    time in a job of thousands of units. Its clients are all alike (fixed keys, the server's port),
    so one per service and region is made and shared; boto3 clients are thread-safe. The pool is
    sized for a Distributed Map's concurrent children."""
    from botocore.config import Config
    from moto.settings import moto_server_port
    from moto.stepfunctions.parser.asl.component.common.timeouts.timeout import TimeoutSeconds
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.item_reader.eval import resource_eval_s3 as reader
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.result_writer.resource_eval import (
        resource_eval_s3 as writer,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    @functools.cache
    def client(region: str, service: str, port: int) -> object:
        timeout = TimeoutSeconds.DEFAULT_TIMEOUT_SECONDS
        return boto3.client(service, region_name=region, endpoint_url=f"http://localhost:{port}", aws_access_key_id="ak",
                            aws_secret_access_key="sk", config=Config(
                                parameter_validation=False, retries={"max_attempts": 0, "total_max_attempts": 1},
                                connect_timeout=timeout, read_timeout=timeout, max_pool_connections=256))

    def boto_client_for(region: str, service: str, state_credentials: object = None) -> object:
        return client(region, service, moto_server_port())

    for module in (reader, writer, lambda_eval_utils):
        module.boto_client_for = boto_client_for
