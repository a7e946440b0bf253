"""Publish Lambda: commits chunks onto main, one at a time, until done or until the time left would not
fit another commit; the workflow loops while ``done`` is false. The loop's history events thus grow
with publishing time, not with the number of chunks (empty chunks cost nothing but a look)."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import PublishEvent, lambda_runtime
from timelake.steps.publish import publish

logger, tracer = Logger(), Tracer()
RESERVE_MS = 5 * 60_000  # a chunk commit (rewriting a partly covered partition in replace mode) fits in this


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = PublishEvent.model_validate(event)
    rt = lambda_runtime()
    if request.max_chunks is not None:
        return publish(rt, request.job_id, request.max_chunks)
    while True:
        result = publish(rt, request.job_id, 1)
        if result["done"] or context.get_remaining_time_in_millis() < RESERVE_MS:
            return result
