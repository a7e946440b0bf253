"""The rollup work queue: every piece reaches the queue, ten a call; a rejected entry is sent again
alone, and one that cannot pass is an error, never a lost piece."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

import timelake.aws.queue as queue_module
from tests.aws_fixtures import aws, moto_server  # noqa: F401
from timelake.aws.queue import WorkQueue
from timelake.errors import BackfillError

URL = "https://sqs.us-east-1.amazonaws.com/123456789012/rollup-work"


def test_every_item_reaches_the_queue(aws):
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="rollup-work")["QueueUrl"]
    items = [{"job_id": "j1", "start": f"2026-01-{day:02d}T00:00:00Z"} for day in range(1, 24)]
    WorkQueue(url).send(items)
    received = []
    while batch := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        received += [json.loads(m["Body"]) for m in batch]
        sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": m["MessageId"], "ReceiptHandle": m["ReceiptHandle"]} for m in batch])
    assert sorted(r["start"] for r in received) == sorted(i["start"] for i in items)


def _stubbed(monkeypatch: pytest.MonkeyPatch, *failures: list[dict]) -> tuple[WorkQueue, Stubber]:
    """A queue on a stubbed client whose send_message_batch fails the given entries in turn (moto never
    reports a partial failure)."""
    monkeypatch.setattr(queue_module, "BACKOFF", 0)
    client = boto3.client("sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(client)
    sent = ["0", "1", "2"]
    for failed in failures:
        stubber.add_response("send_message_batch", {"Successful": [{"Id": i, "MessageId": f"m{i}", "MD5OfMessageBody": "x"}
                                                                   for i in sent if i not in {f["Id"] for f in failed}],
                                                    "Failed": failed},
                             {"QueueUrl": URL, "Entries": [{"Id": i, "MessageBody": json.dumps({"n": int(i)})} for i in sent]})
        sent = [f["Id"] for f in failed]
    stubber.activate()
    return WorkQueue(URL, client=client), stubber


def test_a_rejected_entry_is_sent_again_alone(monkeypatch):
    transient = {"Id": "1", "SenderFault": False, "Code": "InternalError", "Message": "try again"}
    queue, stubber = _stubbed(monkeypatch, [transient], [])
    queue.send([{"n": 0}, {"n": 1}, {"n": 2}])
    stubber.assert_no_pending_responses()


def test_an_entry_that_cannot_pass_raises_with_its_reason(monkeypatch):
    bad = {"Id": "2", "SenderFault": True, "Code": "InvalidMessageContents", "Message": "no"}
    queue, _ = _stubbed(monkeypatch, [bad])
    with pytest.raises(BackfillError, match="rejected 1 work item.*InvalidMessageContents: no"):
        queue.send([{"n": 0}, {"n": 1}, {"n": 2}])
