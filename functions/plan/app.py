"""Plan Lambda: the workflow's first step. Input: the job JSON (its job_id is the execution name)."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import ExecutionEvent, begin, lambda_runtime

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return begin(lambda_runtime(), ExecutionEvent.model_validate(event).spec())
