"""Publish Lambda: commits chunks onto main (``max_chunks`` per call, the workflow loops until done)."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import PublishEvent, lambda_runtime
from timelake.steps.publish import publish

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = PublishEvent.model_validate(event)
    return publish(lambda_runtime(), request.job_id, request.max_chunks)
