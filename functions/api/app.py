"""API Lambda: REST API (IAM auth) over backfill jobs, run by the Step Functions workflow."""

import os
from typing import Annotated, Any, Literal

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import BadRequestError, NotFoundError
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.utilities.typing import LambdaContext

from timelake.errors import BackfillError, JobNotFound, TableNotFound
from timelake.followup.coverage import compute as coverage_map
from timelake.interfaces.orchestrator import StepFunctionsOrchestrator
from timelake.interfaces.service import lambda_runtime
from timelake.model.spec import JobSpec

logger, tracer = Logger(), Tracer()
app = APIGatewayRestResolver(enable_validation=True)


def orchestrator() -> StepFunctionsOrchestrator:
    return StepFunctionsOrchestrator(lambda_runtime(), os.environ["STATE_MACHINE_ARN"],
                                     abort_function=os.environ.get("ABORT_FUNCTION_ARN"))


@app.exception_handler(JobNotFound)
@app.exception_handler(TableNotFound)
def not_found(exc: BackfillError) -> Response:
    raise NotFoundError(str(exc))


@app.exception_handler(ValueError)
@app.exception_handler(BackfillError)
def conflict(exc: Exception) -> Response:
    return Response(409, content_types.APPLICATION_JSON, {"message": str(exc)})


@app.post("/backfills", summary="Start a backfill job (or a dry run)", responses={202: {"description": "Started"}})
def start(job: JobSpec) -> Response[dict[str, Any]]:
    return Response(202, content_types.APPLICATION_JSON, orchestrator().submit(job))


@app.get("/backfills", summary="List jobs, optionally of one table")
def list_jobs() -> list[dict[str, Any]]:
    return orchestrator().list(app.current_event.get_query_string_value("table"))


@app.get("/backfills/<job_id>", summary="Phase, units done/total, rows, throughput, ETA and execution status")
def status(job_id: str) -> dict[str, Any]:
    return orchestrator().status(job_id)


@app.get("/backfills/<job_id>/report", summary="The job report")
def report(job_id: str) -> dict[str, Any]:
    return orchestrator().report(job_id)


@app.post("/backfills/<job_id>/resume", summary="Redrive a failed execution, or start one that skips done units",
          responses={202: {"description": "Resumed"}})
def resume(job_id: str) -> Response[dict[str, Any]]:
    return Response(202, content_types.APPLICATION_JSON, orchestrator().resume(job_id))


@app.post("/backfills/<job_id>/abort", summary="Stop the execution; remove the branch, unpublished files and the lease")
def abort(job_id: str) -> dict[str, Any]:
    return orchestrator().abort(job_id)


@app.post("/backfills/<job_id>/approve", summary="Approve the canary day: write, validate and publish the rest",
          responses={202: {"description": "Approved"}})
def approve(job_id: str) -> Response[dict[str, Any]]:
    return Response(202, content_types.APPLICATION_JSON, orchestrator().approve(job_id))


@app.post("/backfills/<job_id>/reject", summary="Reject the canary day: the workflow aborts the job, main untouched",
          responses={202: {"description": "Rejected"}})
def reject(job_id: str) -> Response[dict[str, Any]]:
    return Response(202, content_types.APPLICATION_JSON, orchestrator().reject(job_id))


@app.get("/tables/<table>/coverage", summary="Rows, files, completeness and writer per hour, day or month of a table, "
        "from its Iceberg metadata (no data file is read)")
def coverage(
    table: str,
    start: Annotated[str | None, Query(description="Inclusive lower bound, ISO (default: the oldest row)")] = None,
    end: Annotated[str | None, Query(description="Exclusive upper bound, ISO (default: the newest row)")] = None,
    by: Annotated[Literal["hour", "day", "month"], Query()] = "day",
    series: Annotated[bool, Query(description="Rows per series too (reads the series-key column)")] = False,
) -> dict[str, Any]:
    try:
        return coverage_map(lambda_runtime(), table, start, end, by=by, series=series).to_dict()
    except ValueError as exc:  # a range that is not one: unreadable, or start after end
        raise BadRequestError(str(exc)) from exc


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)


def openapi() -> str:
    """The committed docs/openapi.json is this output (a test keeps them equal)."""
    return app.get_openapi_json_schema(title="timelake backfill API", version="0.1.0", description=__doc__)


if __name__ == "__main__":
    print(openapi())
