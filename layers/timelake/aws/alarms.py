"""The live path's alarm sink on AWS: one SNS topic that pagers, e-mail and queues subscribe to.

Only `rules.evaluate_live` publishes here. The stack grants ``sns:Publish`` on the topic to none of
the backfill's roles, so a historical evaluation could not page anyone even by mistake.
"""

from __future__ import annotations

import json
from typing import Any

import boto3


class SnsAlarmSink:
    def __init__(self, topic_arn: str, client: Any = None) -> None:
        self.topic_arn = topic_arn
        self._client = client or boto3.client("sns")

    def notify(self, table: str, event: dict[str, Any]) -> None:
        subject = f"{event.get('severity', 'alarm')}: {event.get('rule')} on {table}"[:100]
        self._client.publish(TopicArn=self.topic_arn, Subject=subject,
                             Message=json.dumps({"table": table, **event}, default=str),
                             MessageAttributes={"severity": {"DataType": "String", "StringValue": str(event.get("severity"))}})
