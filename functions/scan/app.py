"""Scan Lambda: one source piece read, mapped, counted and spilled by target partition; outside the job's
quiet hours nothing is read and ``resume_at`` says when to try again (null otherwise)."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import PieceEvent, lambda_runtime, wait_for_window
from timelake.steps.plan import scan

logger, tracer, metrics = Logger(), Tracer(), Metrics()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    piece = PieceEvent.model_validate(event)
    logger.append_keys(job_id=piece.job_id, piece=piece.piece)
    rt = lambda_runtime()
    resume_at = wait_for_window(rt, piece.job_id)
    if resume_at is not None:
        return {"job_id": piece.job_id, "piece": piece.piece, "rows": 0, "resume_at": resume_at}
    result = scan(rt, piece.job_id, piece.piece)
    metrics.add_metric(name="RowsScanned", unit=MetricUnit.Count, value=result["rows"])
    return {**result, "resume_at": None}
