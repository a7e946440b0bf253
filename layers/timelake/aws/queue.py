"""A work queue on SQS: follow-up work after a publish, one message per piece of the published range.

``SendMessageBatch`` can succeed as a call yet reject entries (``Failed``), so rejected entries are
sent again and the send raises if one stays rejected: a lost piece would leave its rollups stale.
"""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
from botocore.config import Config

from timelake.errors import BackfillError

BATCH = 10  # SQS takes at most ten messages a call
ATTEMPTS, BACKOFF = 4, 0.2  # sends of a rejected entry, and the first wait (s), doubled each time


class WorkQueue:
    """JSON work items onto one queue, ten a call."""

    def __init__(self, url: str, client: Any = None) -> None:
        self.url = url
        self._client = client or boto3.client("sqs", config=Config(retries={"mode": "standard"}))

    def send(self, items: list[dict[str, Any]]) -> None:
        for first in range(0, len(items), BATCH):
            pending = {str(i): json.dumps(item) for i, item in enumerate(items[first:first + BATCH], first)}
            for attempt in range(ATTEMPTS):
                response = self._client.send_message_batch(
                    QueueUrl=self.url, Entries=[{"Id": i, "MessageBody": body} for i, body in pending.items()])
                failed = {f["Id"]: f for f in response.get("Failed", [])}
                if not failed:
                    break
                permanent = [f for f in failed.values() if f.get("SenderFault")]
                if permanent or attempt == ATTEMPTS - 1:
                    why = (permanent or list(failed.values()))[0]
                    raise BackfillError(f"SQS queue {self.url} rejected {len(failed)} work item(s): "
                                        f"{why.get('Code')}: {why.get('Message')}")
                pending = {i: body for i, body in pending.items() if i in failed}
                time.sleep(BACKOFF * 2**attempt)
