"""The workflow's history and payloads do not grow with the number of work units: unit and file lists
travel through S3 (ItemReader), Map results go to S3 (ResultWriter) with empty child outputs, and publish
loops by time, not by chunk. Step Functions caps a state's payload at 256 KiB and a Standard
execution at 25,000 history events; moto enforces neither, so the history is measured here.

The same source goes through the real workflow and the real handlers twice: as 4 units (one per
day) and as 160 tiny units (one per series bucket of each day that holds a series), each staged file
then checked by its own item of the validation Map. Both executions
record the same events, as many as ``docs/aws.md`` says (`documented_formula`), which
`expected_events` derives from the workflow file itself: a state added to the success path changes
the count here and makes the docs' formula fail until it is updated.

Made affordable by `cloud_workers` (the handlers in two worker processes, moto in this one) and by
the engine's own per-unit savings (one S3 client per process, single-PUT uploads, the table's
metadata read once per process, the spill index in one read). moto runs a Distributed Map's items
on ``MaxConcurrency`` threads, each of which recurses once per item it runs and dies silently (the
Map then waits forever) after about 980: ``max_concurrency`` must stay above items / 900.
"""

from __future__ import annotations

import functools
import io
import json
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tests.cloud.conftest import BUCKET, ROOT, Cloud
from tests.conftest import TODAY, make_readings, sort_rows
from timelake.model.timeutil import US_PER_DAY
from timelake.steps.scan import series_bucket

PAYLOAD_LIMIT = 64 * 1024  # bytes: a quarter of Step Functions' 256 KiB per state
DAYS, DEVICES = 4, 40  # one row per device and day; the 40 series fall into 40 of the 256 series buckets a day
MAP_CONCURRENCY = 8  # enough to keep both workers busy; each moto Map thread then runs ~20 items (< 980)
EVENTS_PER_STATE = {"Pass": 2, "Choice": 2, "Succeed": 2,  # entered, exited
                    "Task": 5,  # entered, scheduled, started, succeeded, exited
                    "Map": 6}  # entered, started, map run started, map run succeeded, succeeded, exited
EXECUTION_EVENTS = 2  # started, succeeded


def success_path(definition: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The states a successful job without canary passes (the first path from ``StartAt`` to the
    Succeed state, never following a Catch), and the part of it that repeats once per publish
    invocation (from the state the Choice after Publish loops back to, to that Choice). The other
    loop on the path (back to the cut after a diff's main tasks) is not taken by a job whose diff reads
    no file of main outside its units, as here."""
    states = definition["States"]

    def walk(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return None
        path = [*path, name]
        state = states[name]
        if state["Type"] == "Succeed":
            return path
        following = [c["Next"] for c in state.get("Choices", [])] + [state[k] for k in ("Next", "Default") if k in state]
        return next((found for found in (walk(n, path) for n in following) if found), None)

    path = walk(definition["StartAt"], [])
    assert path, "no path from StartAt to a Succeed state"
    loops = []
    for i, name in enumerate(path):
        back = [c["Next"] for c in states[name].get("Choices", []) if c["Next"] in path[:i]]
        if back:
            loops.append(path[path.index(back[0]):i + 1])
    return path, next((loop for loop in loops if "Publish" in loop), [])


def expected_events(publishes: int) -> tuple[int, int]:
    """History events of a successful job without canary, as (fixed part, per publish invocation)."""
    definition = json.loads((ROOT / "statemachine" / "backfill.asl.json").read_text())
    path, loop = success_path(definition)
    kinds = {name: state["Type"] for name, state in definition["States"].items()}
    per_publish = sum(EVENTS_PER_STATE[kinds[n]] for n in loop)
    fixed = EXECUTION_EVENTS + sum(EVENTS_PER_STATE[kinds[n]] for n in path) - per_publish
    return fixed, per_publish


def documented_formula() -> tuple[int, int]:
    """``events = A + B * P`` as docs/aws.md states it."""
    found = re.search(r"events = (\d+) \+ (\d+) \* P", (ROOT / "docs" / "aws.md").read_text())
    assert found, "docs/aws.md no longer states the events per job as 'events = A + B * P'"
    return int(found[1]), int(found[2])


def history(cloud: Cloud, arn: str) -> list[dict[str, Any]]:
    pages = cloud.sfn.get_paginator("get_execution_history").paginate(executionArn=arn)
    return [event for page in pages for event in page["events"]]


def largest_payload(events: list[dict[str, Any]]) -> int:
    sizes = [len(details[key].encode()) for event in events for name, details in event.items()
             if name.endswith("EventDetails") for key in ("input", "output", "parameters")
             if isinstance(details.get(key), str)]
    return max(sizes)


def _read_file(s3: Any, uri: str) -> pa.Table:
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    return pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))


def _day_buckets(source: pa.Table) -> int:
    """Units of a job cut to one per series bucket of a day: the (day, bucket) pairs that hold rows."""
    days = pc.divide(source.column("ts").cast(pa.int64()), US_PER_DAY).to_numpy()
    buckets = series_bucket(source, ("device_id",))
    return len(set(zip(days.tolist(), buckets.tolist(), strict=True)))


def test_the_events_per_job_are_derived_from_the_workflow_and_documented() -> None:
    path, loop = success_path(json.loads((ROOT / "statemachine" / "backfill.asl.json").read_text()))
    assert path[0] == "Start" and path[-1] == "Published" and "Write units" in path and "Check canary day" not in path
    assert loop == ["Publish", "All chunks published?"]
    assert documented_formula() == expected_events(1)


def test_history_events_and_payloads_do_not_depend_on_the_number_of_units(cloud_workers: Cloud) -> None:
    cloud = cloud_workers
    first = (TODAY.date().replace(day=1) - timedelta(days=1)).replace(day=1)  # last month: one publish chunk
    source = make_readings(first.isoformat(), days=DAYS, devices=DEVICES, step_minutes=24 * 60)
    buffer = io.BytesIO()
    pq.write_table(source, buffer)
    s3 = boto3.client("s3")
    s3.put_object(Bucket=BUCKET, Key="src/a.parquet", Body=buffer.getvalue())
    runs = {}
    for name, target_file_size in (("few", "128MB"), ("many", 1)):  # 1 byte: one unit per series bucket of a day
        cloud.lake.create_table(f"iot.{name}", schema=source.schema, time_column="ts", series_key=["device_id"],
                                partition_by="day", retention="P3Y", target_file_size=target_file_size)
        job = {"table": f"iot.{name}", "source": f"s3://{BUCKET}/src/a.parquet", "publish_by": "month",
               "max_concurrency": MAP_CONCURRENCY}
        result = cloud.run(job, f"bf-{name}", timeout=900)
        assert result["status"] == "SUCCEEDED", result
        events = history(cloud, result["executionArn"])
        publishes = sum(1 for e in events if e["type"] == "TaskStateEntered" and e["stateEnteredEventDetails"]["name"] == "Publish")
        units = cloud.lake.runtime.store.units(f"bf-{name}")
        runs[name] = {"units": len(units), "events": len(events), "publishes": publishes, "payload": largest_payload(events)}

        # Every unit's rows are on main once: its file is in the table once, with the rows it wrote, and
        # together the files hold the source's rows (read with one GET each, not through the engine).
        table = cloud.lake.table(f"iot.{name}").iceberg
        files = {f.file_path: f.record_count for task in table.scan().plan_files() for f in [task.file]}
        assert files == {u.result["path"]: u.result["rows_written"] for u in units}, name
        with ThreadPoolExecutor(8) as pool:
            rows = pa.concat_tables(pool.map(functools.partial(_read_file, s3), files))
        assert sort_rows(rows).equals(sort_rows(source)), name
        check_run = next(run for run in cloud.sfn.list_map_runs(executionArn=result["executionArn"])["mapRuns"]
                         if "CheckFiles" in run["mapRunArn"])
        assert cloud.sfn.describe_map_run(mapRunArn=check_run["mapRunArn"])["itemCounts"]["succeeded"] == len(files), name
    print("events and payloads:", runs)  # the numbers docs/aws.md quotes
    few, many = runs["few"], runs["many"]
    assert few["units"] == DAYS and many["units"] == _day_buckets(source) > 30 * DAYS, runs
    assert few["publishes"] == many["publishes"] == 1, runs
    fixed, per_publish = expected_events(1)
    assert few["events"] == many["events"] == fixed + per_publish * 1 == sum(documented_formula()), runs
    assert max(few["payload"], many["payload"]) < PAYLOAD_LIMIT and many["payload"] < 2 * few["payload"], runs
