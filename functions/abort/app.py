"""Abort Lambda: drop an unpublished job (branch, unpublished files, scratch, lease).

The one function besides publish and rollup that may delete lake files: the workflow's canary
rejection and the API's abort route both come here, so the API itself stays read-only on the lake.
"""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import AbortEvent, lambda_runtime
from timelake.steps import canary
from timelake.steps.abort import abort

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = AbortEvent.model_validate(event)
    logger.append_keys(job_id=request.job_id)
    rt = lambda_runtime()
    if request.canary:
        return canary.reject(rt, request.job_id, request.reason)
    return abort(rt, request.job_id)
