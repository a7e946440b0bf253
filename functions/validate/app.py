"""Validate Lambda: the checks on the branch; a failed check fails the execution before publish."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import JobEvent, lambda_runtime
from timelake.steps.validate import validate

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return validate(lambda_runtime(), JobEvent.model_validate(event).job_id)
