"""Scan Lambda: one source piece read, mapped, counted and spilled by target partition."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import PieceEvent, lambda_runtime
from timelake.steps.plan import scan

logger, tracer, metrics = Logger(), Tracer(), Metrics()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    piece = PieceEvent.model_validate(event)
    logger.append_keys(job_id=piece.job_id, piece=piece.piece)
    result = scan(lambda_runtime(), piece.job_id, piece.piece)
    metrics.add_metric(name="RowsScanned", unit=MetricUnit.Count, value=result["rows"])
    return result
