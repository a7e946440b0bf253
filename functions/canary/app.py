"""Canary Lambda: check the canary day, keep the task token while the workflow waits, approve or reject."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import CanaryEvent, lambda_runtime
from timelake.steps import canary

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = CanaryEvent.model_validate(event)
    rt = lambda_runtime()
    if request.action == "check":
        return canary.check(rt, request.job_id)
    if request.action == "await":
        return canary.await_decision(rt, request.job_id, str(request.token))
    if request.action == "approve":
        return canary.approve(rt, request.job_id)
    return canary.reject(rt, request.job_id, request.reason)
