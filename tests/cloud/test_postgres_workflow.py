"""A PostgreSQL source through the real workflow: scan Lambdas read their pieces from a real server,
the scan map's concurrency is the source connection limit, and the rate budget lives in DynamoDB."""

from __future__ import annotations

from datetime import timedelta

import boto3

from tests.cloud.conftest import JOBS, Cloud, sensor_table
from tests.conftest import SCHEMA, sort_rows
from tests.sources.conftest import postgres, readings_table, year_start  # noqa: F401
from timelake.model.timeutil import iso, to_micros


def test_a_postgres_source_runs_on_the_workflow_within_its_limits(cloud: Cloud, postgres, readings_table):  # noqa: F811
    table = sensor_table(cloud.lake)
    start, end = (iso(to_micros(year_start() + timedelta(days=d))) for d in (0, 3))
    job = {"table": "iot.sensor", "source": postgres.uri(table=readings_table, piece_rows="500"), "start": start,
           "end": end, "max_concurrency": 8, "source_max_connections": 3, "source_rows_per_second": 1_000_000}
    result = cloud.run(job, "bf-pg")
    assert result["status"] == "SUCCEEDED", result
    expected = postgres.sql(f"SELECT ts, device_id, value FROM readings WHERE ts >= '{start}' AND ts < '{end}'")
    assert sort_rows(table.to_arrow()).equals(sort_rows(expected.cast(SCHEMA))) and expected.num_rows == 3 * 24 * 20
    sfn = boto3.client("stepfunctions")
    runs = {sfn.describe_map_run(mapRunArn=run["mapRunArn"])["maxConcurrency"]
            for run in sfn.list_map_runs(executionArn=result["executionArn"])["mapRuns"]}
    assert runs == {3, 8}  # the scan map reads the source with 3; the write map writes with 8
    budget = boto3.client("dynamodb").get_item(TableName=JOBS, Key={"pk": {"S": "JOB#bf-pg"}, "sk": {"S": "RATE"}})
    assert float(budget["Item"]["empty_at"]["N"]) > 0
    limits = cloud.lake.job("bf-pg").report()["source_limits"]
    assert (limits["max_connections"], limits["rows_per_second"]) == (3, 1_000_000)
