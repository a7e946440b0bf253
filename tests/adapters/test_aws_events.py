"""The EventBridge bus: events reach a rule's target, and a rejected event is an error, never lost."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from tests.aws_fixtures import aws, moto_server  # noqa: F401
from timelake.aws.events import SOURCE, EventBridgeBus, EventPublishError
from timelake.ports.events import BACKFILL_PUBLISHED

DETAIL = {"job_id": "j1", "table": "iot.sensor", "chunk": "2024-01", "snapshot_ids": [11, 12]}


def test_published_event_reaches_the_rule_target(aws):
    events, sqs = boto3.client("events"), boto3.client("sqs")
    events.create_event_bus(Name="lake")
    queue = sqs.create_queue(QueueName="rollups")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    pattern = {"source": [SOURCE], "detail-type": [BACKFILL_PUBLISHED]}
    events.put_rule(Name="published", EventBusName="lake", EventPattern=json.dumps(pattern))
    events.put_targets(Rule="published", EventBusName="lake", Targets=[{"Id": "rollups", "Arn": queue_arn}])
    bus = EventBridgeBus("lake")
    bus.put("Backfill Started", {"job_id": "j1"})  # not matched by the rule
    bus.put(BACKFILL_PUBLISHED, DETAIL)
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert [json.loads(m["Body"])["detail-type"] for m in messages] == [BACKFILL_PUBLISHED]
    event = json.loads(messages[0]["Body"])
    assert (event["source"], event["detail"]) == (SOURCE, DETAIL)


def test_a_missing_bus_is_named_in_the_error(aws):
    with pytest.raises(EventPublishError, match="bus 'nowhere'.*ResourceNotFoundException"):
        EventBridgeBus("nowhere").put(BACKFILL_PUBLISHED, DETAIL)


def test_a_rejected_entry_raises_without_retrying_what_cannot_pass(aws):
    boto3.client("events").create_event_bus(Name="lake")
    with pytest.raises(EventPublishError, match="bus 'lake' rejected event '': InvalidArgument: .*DetailType"):
        EventBridgeBus("lake", backoff=60).put("", DETAIL)


def _stubbed(*errors: str | None) -> tuple[EventBridgeBus, Stubber]:
    """A bus on a stubbed client whose put_events rejects the entry with each error code in turn
    (None: accepted): moto never reports a transient rejection."""
    client = boto3.client("events", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(client)
    entry = {"Source": SOURCE, "DetailType": BACKFILL_PUBLISHED, "Detail": json.dumps(DETAIL), "EventBusName": "lake"}
    for code in errors:
        result = {"ErrorCode": code, "ErrorMessage": f"{code} happened"} if code else {"EventId": "e1"}
        response = {"FailedEntryCount": int(code is not None), "Entries": [result]}
        stubber.add_response("put_events", response, {"Entries": [entry]})
    stubber.activate()
    return EventBridgeBus("lake", client=client, attempts=3, backoff=0), stubber


def test_transient_rejections_are_retried():
    bus, stubber = _stubbed("ThrottlingException", "InternalFailure", None)
    bus.put(BACKFILL_PUBLISHED, DETAIL)
    stubber.assert_no_pending_responses()


def test_a_rejection_that_persists_raises_with_its_reason():
    bus, stubber = _stubbed("InternalFailure", "InternalFailure", "ThrottlingException")
    with pytest.raises(EventPublishError, match="after 3 attempts: ThrottlingException: ThrottlingException happened"):
        bus.put(BACKFILL_PUBLISHED, DETAIL)
    stubber.assert_no_pending_responses()
