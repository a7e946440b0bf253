"""Stage Lambda: one commit of every unit's file to the job's branch."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import JobEvent, finish_writes, lambda_runtime
from timelake.steps.stage import stage

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    job = JobEvent.model_validate(event)
    rt = lambda_runtime()
    finish_writes(rt, job.job_id)
    return stage(rt, job.job_id)
