"""Rollup Lambda: an EventBridge rule on "Backfill Published" invokes it with the published range;
it refreshes the rollups there and, if the job asked, evaluates the rules in historical mode."""

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.followup.refresh import PublishedEvent, on_published
from timelake.interfaces.service import lambda_runtime

logger, tracer = Logger(), Tracer()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    published = PublishedEvent.model_validate(event["detail"])
    return {"job_id": published.job_id, **on_published(lambda_runtime(), published)}
