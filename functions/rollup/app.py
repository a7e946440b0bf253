"""Rollup Lambda: refreshes the rollups over a published range and, if the job asked, evaluates the
rules there in historical mode. Two triggers: the EventBridge rule on "Backfill Published" (one event
per published chunk; a chunk longer than one piece of work, a day or a month with daily rollups, is
cut into pieces put on the rollup work queue), and that queue (one piece a message, at most the
queue's concurrency at once)."""

import json
import os
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.aws.queue import WorkQueue
from timelake.followup.refresh import PublishedEvent, on_published
from timelake.interfaces.service import after_publish, lambda_runtime

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if "Records" in event:  # the work queue: one piece a message (a failure returns the batch to the queue)
        work = [PublishedEvent.model_validate(json.loads(record["body"])) for record in event["Records"]]
        return {"pieces": [{"job_id": piece.job_id, "start": piece.start, **on_published(lambda_runtime(), piece)}
                           for piece in work]}
    queue = os.environ.get("ROLLUP_QUEUE_URL")
    return after_publish(lambda_runtime(), event["detail"], WorkQueue(queue) if queue else None)
