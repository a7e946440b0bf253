"""Cut Lambda: merges the scans into work units, takes the lease, creates the branch, lists the units."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import JobEvent, cut_units, lambda_runtime

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return cut_units(lambda_runtime(), JobEvent.model_validate(event).job_id)
