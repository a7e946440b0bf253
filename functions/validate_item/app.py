"""Validate-item Lambda: one staged file's checks (one item of the workflow's validation Distributed Map).

It reads that file's key and value columns a batch at a time and stores what it found beside the job's
scratch files, where the validate Lambda's ``conclude`` reads it; the answer is a few fields, since the
Map keeps no child output. Outside the job's quiet hours it checks nothing and ``resume_at`` says when
to try again (null otherwise)."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import CheckEvent, lambda_runtime, wait_for_window
from timelake.steps.validate import check_file

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    item = CheckEvent.model_validate(event)
    logger.append_keys(job_id=item.job_id, file=item.file)
    rt = lambda_runtime()
    resume_at = wait_for_window(rt, item.job_id)
    if resume_at is not None:
        return {"file": item.file, "resume_at": resume_at}
    return {**check_file(rt, item.job_id, item.file, item.spec_id, item.partition), "resume_at": None}
