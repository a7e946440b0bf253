"""API Lambda: REST API (IAM auth) over backfill jobs, run by the Step Functions workflow."""

import base64
import json
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
from pydantic import ValidationError

from timelake.model.spec import DocumentError, JobSpec, Settings, external_job, parse_document, printable

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
    return Response(409, content_types.APPLICATION_JSON, {"message": printable(str(exc))})


@app.post("/backfills", summary="Start a backfill job (or a dry run)", responses={202: {"description": "Started"}})
def start(job: JobSpec) -> Response[dict[str, Any]]:
    lambda_runtime().load_table(job.table)  # a 404 now rather than a failed execution later
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


@app.post("/backfills/<job_id>/settings", summary="Change a job's max_concurrency or source_rows_per_second while it "
          "runs: the running Map and the next ones, the next rows read; a finished job is refused")
def settings(job_id: str, change: Settings) -> dict[str, Any]:
    return orchestrator().set_settings(job_id, **change.model_dump())


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
    except (ValueError, OverflowError) as exc:  # a range that is not one: unreadable, start after end, too many buckets
        raise BadRequestError(str(exc)) from exc


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if event.get("httpMethod") == "POST" and event.get("path") == "/backfills":
        refused = screen_job(event.get("body"), bool(event.get("isBase64Encoded")))
        if refused is not None:
            return refused
    return app.resolve(event, context)


def screen_job(body: str | None, is_base64: bool) -> dict[str, Any] | None:
    """The job document through the validation the CLI runs (`external_job`), before Powertools parses it:
    413 for a body over 1 MiB, 400 for bytes that are not UTF-8 or text that is not JSON or nests too
    deep (`parse_document`), 422 for a job the CLI refuses. None when the job is one the CLI would run."""
    try:
        raw = base64.b64decode(body or "") if is_base64 else (body or "").encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        return _refuse(400, "the body is not UTF-8")
    try:
        document = parse_document(raw)
    except DocumentError as exc:
        return _refuse(exc.status, str(exc))
    try:
        external_job(document)
    except ValidationError as exc:  # the fields and messages, never the input (it may hold a secret)
        return _refuse(422, "the job is invalid", [{"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
                                                   for e in exc.errors()])
    except (ValueError, TypeError, OverflowError) as exc:
        return _refuse(422, str(exc), [{"loc": ["body"], "msg": str(exc), "type": "value_error"}])
    return None


def _refuse(status: int, message: str, detail: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = {"statusCode": status, "message": printable(message), **({"detail": detail} if detail else {})}
    return {"statusCode": status, "headers": {"Content-Type": content_types.APPLICATION_JSON},
            "multiValueHeaders": {}, "body": json.dumps(body), "isBase64Encoded": False}


def openapi() -> str:
    """The committed docs/openapi.json is this output (a test keeps them equal)."""
    return app.get_openapi_json_schema(title="timelake backfill API", version="0.1.0", description=__doc__)


if __name__ == "__main__":
    print(openapi())
