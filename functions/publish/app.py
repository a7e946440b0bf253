"""Publish Lambda: commits chunks onto main, one at a time, until done or until the time left would not
fit another commit; the workflow loops while ``done`` is false. The loop's history events thus grow
with publishing time, not with the number of chunks (empty chunks cost nothing but a look). Outside
the job's quiet hours it commits nothing more and answers ``resume_at``, which the workflow waits for
before it calls again."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import PublishEvent, lambda_runtime, wait_for_window
from timelake.steps.publish import publish

logger, tracer = Logger(), Tracer()
RESERVE_MS = 5 * 60_000  # a chunk commit (rewriting a partly covered partition in replace mode) fits in this


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = PublishEvent.model_validate(event)
    rt = lambda_runtime()
    while True:
        resume_at = wait_for_window(rt, request.job_id)
        if resume_at is not None:
            published = rt.store.get_job(request.job_id).state.get("published_chunks", {})
            return {"job_id": request.job_id, "done": False, "chunks_published": len(published), "resume_at": resume_at}
        result = publish(rt, request.job_id, request.max_chunks or 1) | {"resume_at": None}
        if request.max_chunks is not None or result["done"] or context.get_remaining_time_in_millis() < RESERVE_MS:
            return result
