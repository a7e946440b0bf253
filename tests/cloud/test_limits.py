"""The workflow's history and payloads do not grow with the number of work units: unit and file lists
travel through S3 (ItemReader), Map results go to S3 (ResultWriter) with empty child outputs, and publish
loops by time, not by chunk. Step Functions caps a state's payload at 256 KiB and a Standard
execution at 25,000 history events; moto enforces neither, so the history is measured here.

Events of a successful job without canary (see docs/aws.md, "History events per job"):
``55 + 7 * P`` where P is the number of publish invocations. Measured here: 2 units and 80 units
(2 days x 40 devices; as many staged files, each checked by its own item of the validation Map) both
give 62 events with P = 1; the largest payload is 963 and 976 bytes.
A 3,000-unit run is the next step (moto's Distributed Map itself records 8 events for 3,000 items
in about 3 s; the real write handler per unit is what makes such a run slow here)."""

from __future__ import annotations

import io
from typing import Any

import boto3
import pyarrow.parquet as pq

from tests.cloud.conftest import BUCKET, Cloud
from tests.conftest import recent

PAYLOAD_LIMIT = 64 * 1024  # bytes: a quarter of Step Functions' 256 KiB per state


def history(cloud: Cloud, arn: str) -> list[dict[str, Any]]:
    pages = cloud.sfn.get_paginator("get_execution_history").paginate(executionArn=arn)
    return [event for page in pages for event in page["events"]]


def largest_payload(events: list[dict[str, Any]]) -> int:
    sizes = [len(details[key].encode()) for event in events for name, details in event.items()
             if name.endswith("EventDetails") for key in ("input", "output") if isinstance(details.get(key), str)]
    return max(sizes)


def test_history_events_and_payloads_do_not_depend_on_the_number_of_units(cloud: Cloud, readings) -> None:
    source = readings(recent(9), days=2, devices=40)
    buffer = io.BytesIO()
    pq.write_table(source, buffer)
    boto3.client("s3").put_object(Bucket=BUCKET, Key="src/a.parquet", Body=buffer.getvalue())
    schema = source.schema
    runs = {}
    for table, size in (("iot.few", "128MB"), ("iot.many", 1)):  # 1 byte: one unit per series bucket of a day
        cloud.lake.create_table(table, schema=schema, time_column="ts", series_key=["device_id"], partition_by="day",
                                retention="P3Y", target_file_size=size)
        job = {"table": table, "source": f"s3://{BUCKET}/src/a.parquet", "publish_by": "month"}
        result = cloud.run(job, f"bf-{table.split('.')[1]}", timeout=300)
        assert result["status"] == "SUCCEEDED", result
        report = cloud.lake.job(f"bf-{table.split('.')[1]}").report()
        events = history(cloud, result["executionArn"])
        publishes = sum(1 for e in events if e["type"] == "TaskStateEntered" and e["stateEnteredEventDetails"]["name"] == "Publish")
        runs[table] = (report["units"], len(events), publishes, largest_payload(events))
        check_run = next(run for run in cloud.sfn.list_map_runs(executionArn=result["executionArn"])["mapRuns"]
                         if "CheckFiles" in run["mapRunArn"])
        assert cloud.sfn.describe_map_run(mapRunArn=check_run["mapRunArn"])["itemCounts"]["succeeded"] == report["files"]
        assert cloud.lake.table(table).to_arrow().num_rows == source.num_rows
    (few_units, few_events, few_publishes, few_payload), (many_units, many_events, many_publishes, many_payload) = runs.values()
    assert few_units == 2 and many_units >= 30 * few_units, runs
    assert few_publishes == many_publishes == 1 and few_events == many_events == 55 + 7 * few_publishes, runs
    assert max(few_payload, many_payload) < PAYLOAD_LIMIT and many_payload < 2 * few_payload, runs
