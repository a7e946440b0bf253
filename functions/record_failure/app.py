"""Record-failure Lambda: every failure path of the workflow passes here before the Fail state."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import FailureEvent, fail, lambda_runtime

logger = Logger()


@logger.inject_lambda_context
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, str]:
    failure = FailureEvent.model_validate(event)
    logger.error("backfill failed", extra={"job_id": failure.job_id, "error": failure.error})
    return fail(lambda_runtime(), failure.job_id, failure.error, failure.cause)
