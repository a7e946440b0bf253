"""Write Lambda: one work unit, one Parquet file. Input: one item of the units manifest (or of a diff's
main tasks, which read main's range before the units). Outside the job's quiet hours it does nothing and
answers when to try again (``resume_at``, for the Map item's Wait state); otherwise ``resume_at`` is null."""

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.interfaces.service import MainTaskEvent, UnitEvent, lambda_runtime, wait_for_window
from timelake.steps.diff import read_main
from timelake.steps.write import write_unit

logger, tracer, metrics = Logger(), Tracer(), Metrics()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    rt = lambda_runtime()
    if "main_task" in event:  # the write Map runs a diff's main tasks before the units (they read main's range)
        task = MainTaskEvent.model_validate(event)
        logger.append_keys(job_id=task.job_id, main_task=task.main_task)
        resume_at = wait_for_window(rt, task.job_id)
        rows = 0 if resume_at is not None else read_main(rt, task.job_id, task.main_task).get("rows", 0)
        metrics.add_metric(name="MainRowsRead", unit=MetricUnit.Count, value=rows)
        return {"main_task": task.main_task, "rows": rows, "resume_at": resume_at}
    unit = UnitEvent.model_validate(event)
    logger.append_keys(job_id=unit.job_id, unit_id=unit.unit_id)
    resume_at = wait_for_window(rt, unit.job_id)
    if resume_at is not None:
        return {"unit_id": unit.unit_id, "rows_written": 0, "resume_at": resume_at}
    result = write_unit(rt, unit.job_id, unit.unit_id)
    metrics.add_metric(name="RowsWritten", unit=MetricUnit.Count, value=result["rows_written"])
    metrics.add_metric(name="BytesWritten", unit=MetricUnit.Bytes, value=result["bytes"])
    metrics.add_metric(name="UnitDuration", unit=MetricUnit.Seconds, value=result.get("seconds", 0))
    return {"unit_id": unit.unit_id, "rows_written": result["rows_written"], "resume_at": None}
