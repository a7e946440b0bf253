"""Validate Lambda, on both sides of the workflow's per-file checks: ``list`` writes the staged files as
the Distributed Map's items to S3; ``conclude`` combines the facts each item stored into the job's
checks (row balance, aggregates, uniqueness across files, overlap with main, SQL assertions). A failed
check fails the execution before publish."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import ValidateEvent, lambda_runtime, list_checks
from timelake.steps.validate import validate

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = ValidateEvent.model_validate(event)
    logger.append_keys(job_id=request.job_id)
    if request.action == "list":
        return list_checks(lambda_runtime(), request.job_id)
    return validate(lambda_runtime(), request.job_id)
