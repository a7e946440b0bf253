"""The real workflow file, executed by moto's Step Functions engine with the real handlers."""

from __future__ import annotations

import io
import json

import boto3
import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import timelake
from tests.cloud.conftest import BUCKET, BUS, Cloud, sensor_table
from tests.conftest import recent, reference_merge, sort_rows
from timelake.adapters import compose


def _upload(table: pa.Table, key: str) -> str:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    boto3.client("s3").put_object(Bucket=BUCKET, Key=key, Body=buffer.getvalue())
    return f"s3://{BUCKET}/{key}"


def test_dry_run_succeeds_with_the_report_and_changes_nothing(cloud: Cloud, readings):
    table = sensor_table(cloud.lake)
    _upload(readings(recent(6), days=2, devices=2), "src/a.parquet")
    result = cloud.run({"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet", "dry_run": True}, "bf-dry")
    assert result["status"] == "SUCCEEDED", result
    report = json.loads(result["output"])
    assert report["phase"] == "dry_run_complete" and report["rows_in_source"] == 96 and report["units"] == 2
    assert table.refresh().iceberg.current_snapshot() is None
    # the units predict the job's diff, writing nothing; the cut step then ends the dry run
    assert cloud.invocations == ["timelake-plan", "timelake-scan", "timelake-cut", "timelake-write", "timelake-write",
                                 "timelake-cut"]
    predicted = cloud.lake.job("bf-dry").diff()
    assert predicted["predicted"] and predicted["totals"]["only_after"] == 96 and predicted["totals"]["rows_before"] == 0


def test_full_backfill_equals_the_embedded_runner(cloud: Cloud, readings, tmp_path):
    existing = readings(recent(8), days=2, devices=3, seed=1)
    source = readings(recent(7), days=3, devices=3, seed=2)
    table = sensor_table(cloud.lake)
    table.append(existing)
    _upload(source.slice(0, 100), "src/part-0.parquet")
    _upload(source.slice(100), "src/part-1.parquet")
    queue = _subscribe_queue()
    checked, facts_at_conclusion = [], []
    cloud.before["timelake-validate_item"] = checked.append
    cloud.before["timelake-validate"] = lambda event: facts_at_conclusion.extend(
        _keys(f"_backfill/{event['job_id']}/validate/") if event["action"] == "conclude" else [])
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet", "publish_by": "day", "max_concurrency": 4}
    result = cloud.run(job, "bf-cloud-1")
    assert result["status"] == "SUCCEEDED", result
    cloud_rows = sort_rows(table.to_arrow())

    embedded = timelake.connect(warehouse=tmp_path / "embedded")
    local = embedded.create_table("iot.sensor", schema=table.iceberg.schema().as_arrow(), time_column="ts",
                                  series_key=["device_id"], partition_by="day", retention="P3Y")
    local.append(existing)
    local.backfill(source=source, publish_by="day").wait()
    assert cloud_rows.equals(sort_rows(local.to_arrow()))
    assert cloud_rows.equals(reference_merge(existing, source))

    report = cloud.lake.job("bf-cloud-1").report()
    assert report["phase"] == "published" and len(report["published_chunks"]) == 3
    assert len(report["published_snapshot_ids"]) == 2  # the first day held only existing keys: nothing to commit
    assert cloud.invocations.count("timelake-write") == report["units"] + 1 == 4  # and the diff's main task, first
    assert report["diff"]["totals"]["rows_before"] == 72 and report["diff"]["totals"]["only_after"] == report["rows_written"]
    assert cloud.invocations.count("timelake-publish") == 1  # chunk by chunk inside one call, while time is left

    # Validation fanned out: the Map gave each staged file its own item invocation, each stored its facts in
    # S3, and the validate Lambda concluded from them (the facts were all there when it was called).
    staged = sorted(u.result["path"] for u in cloud.lake.runtime.store.units("bf-cloud-1") if u.result.get("path"))
    assert sorted(item["file"] for item in checked) == staged and len(staged) == 2  # the first day wrote no file
    assert len({item["partition"] for item in checked}) == 2
    assert cloud.invocations.count("timelake-validate") == 2  # list the items, then conclude
    facts = [key for key in facts_at_conclusion if not key.endswith("/files.json")]
    assert len(facts) == 2 and len(facts_at_conclusion) == 3, facts_at_conclusion
    check_run = next(run for run in cloud.sfn.list_map_runs(executionArn=result["executionArn"])["mapRuns"]
                     if "CheckFiles" in run["mapRunArn"])
    counts = cloud.sfn.describe_map_run(mapRunArn=check_run["mapRunArn"])["itemCounts"]
    assert (counts["total"], counts["succeeded"]) == (2, 2)
    steps = {s["name"]: s for s in report["steps"]}  # timed from the phases the Lambdas entered, in DynamoDB
    assert list(steps) == ["plan", "scan", "write", "stage", "validate", "publish"]  # the cut runs in the scan's time
    assert {s["state"] for s in steps.values()} == {"done"} and steps["scan"]["rows"] == 216
    assert (steps["scan"]["done"], steps["write"]["done"], steps["publish"]["done"]) == (2, 3, 3)
    assert report["elapsed_seconds"] > 0
    assert report["elapsed_seconds"] == pytest.approx(sum(s["elapsed_seconds"] for s in steps.values()), abs=0.01)
    assert "backfill/bf-cloud-1" not in table.refresh().iceberg.metadata.refs
    events = _received(queue, 3)
    assert [e["detail-type"] for e in events] == ["Backfill Published"] * 3
    assert sorted(e["detail"]["start"] for e in events) == [f"{recent(d)}T00:00:00Z" for d in (7, 6, 5)]
    assert {e["detail"]["job_id"] for e in events} == {"bf-cloud-1"}
    signal = table.coverage().to_pylist()  # the completion signal, written by the publish Lambda into Glue
    assert {r["partition"]: (r["last_writer"], r["rows"]) for r in signal} == {
        recent(7): ("live", 72), recent(6): ("bf-cloud-1", 72), recent(5): ("bf-cloud-1", 72)}


def _keys(prefix: str) -> list[str]:
    return [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def _subscribe_queue() -> str:
    """An SQS queue behind a rule on the bus (moto delivers EventBridge events to SQS)."""
    sqs, events = boto3.client("sqs"), boto3.client("events")
    url = sqs.create_queue(QueueName="published")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="published", EventBusName=BUS, EventPattern=json.dumps({"detail-type": ["Backfill Published"]}))
    events.put_targets(Rule="published", EventBusName=BUS, Targets=[{"Id": "q", "Arn": arn}])
    return url


def _received(url: str, count: int) -> list[dict]:
    sqs, messages = boto3.client("sqs"), []
    for _ in range(20):
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        messages += [json.loads(m["Body"]) for m in batch]
        if len(messages) >= count:
            break
    return messages


def test_failure_is_recorded_surfaced_and_resumable(cloud: Cloud, readings):
    table = sensor_table(cloud.lake)
    source = readings(recent(6), days=2, devices=2)
    _upload(source.slice(0, 50), "src/good.parquet")
    boto3.client("s3").put_object(Bucket=BUCKET, Key="src/zbad.parquet", Body=b"PAR1 not parquet")
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet"}
    result = cloud.run(job, "bf-broken")
    assert result["status"] == "FAILED"
    assert "zbad.parquet" in result["cause"] and "bf-broken" in result["cause"]
    status = cloud.lake.job("bf-broken").status()
    assert status["phase"] == "failed" and "zbad.parquet" in status["error"]
    assert table.refresh().iceberg.current_snapshot() is None

    _upload(source.slice(50), "src/zbad.parquet")  # the source is fixed
    resumed = cloud.run({**job, "job_id": "bf-broken"}, "bf-broken-resume-1")
    assert resumed["status"] == "SUCCEEDED", resumed
    assert sort_rows(table.to_arrow()).equals(sort_rows(source))
    assert cloud.lake.job("bf-broken").report()["phase"] == "published"


def test_a_new_execution_of_a_published_job_changes_nothing(cloud: Cloud, readings):
    table = sensor_table(cloud.lake)
    _upload(readings(recent(6), days=1, devices=2), "src/a.parquet")
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet"}
    assert cloud.run(job, "bf-once")["status"] == "SUCCEEDED"
    snapshot = table.refresh().iceberg.current_snapshot().snapshot_id
    again = cloud.run({**job, "job_id": "bf-once"}, "bf-once-r1")
    assert again["status"] == "SUCCEEDED" and json.loads(again["output"])["phase"] == "published"
    assert table.refresh().iceberg.current_snapshot().snapshot_id == snapshot
    assert cloud.lake.job("bf-once").report()["phase"] == "published"


def test_the_published_event_drives_the_rollup_handler(cloud: Cloud, readings, monkeypatch):
    """One event for the job's two days: the rollup Lambda cuts it into a piece a day on its work queue,
    and each piece is refreshed by its own invocation from that queue; without a queue it does both."""
    from tests.cloud.conftest import _Context, load_function
    from tests.conftest import SCHEMA

    table = cloud.lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                                    rollups=[{"interval": "1h", "columns": ["value"]}])
    queue = _subscribe_queue()
    _upload(readings(recent(6), days=2, devices=2, step_minutes=20), "src/a.parquet")
    assert cloud.run({"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet"}, "bf-rollup")["status"] == "SUCCEEDED"
    (event,) = _received(queue, 1)  # what the EventBridge rule hands the rollup Lambda
    rollup = load_function("rollup").handler
    assert rollup(event, _Context("timelake-rollup")) == {"job_id": "bf-rollup", "rollups": {"iot.sensor_1h": 96}}

    work = boto3.client("sqs").create_queue(QueueName="rollup-work")["QueueUrl"]
    monkeypatch.setenv("ROLLUP_QUEUE_URL", work)
    assert rollup(event, _Context("timelake-rollup")) == {"job_id": "bf-rollup", "pieces_queued": 2}
    messages = boto3.client("sqs").receive_message(QueueUrl=work, MaxNumberOfMessages=10).get("Messages", [])
    done = [rollup({"Records": [{"messageId": m["MessageId"], "body": m["Body"]}]}, _Context("timelake-rollup"))["pieces"]
            for m in messages]
    assert sorted((p["start"], p["rollups"]["iot.sensor_1h"]) for (p,) in done) == [
        (f"{recent(6)}T00:00:00Z", 48), (f"{recent(5)}T00:00:00Z", 48)]
    base = table.to_arrow()  # noqa: F841 (read by DuckDB)
    expected = duckdb.sql("""SELECT device_id, count(*) AS n, sum(value) AS s FROM base
                             GROUP BY device_id, date_trunc('hour', ts) ORDER BY ALL""").fetchall()
    rollup = cloud.lake.catalog.load_table("iot.sensor_1h").scan().to_arrow()  # noqa: F841
    got = duckdb.sql("SELECT device_id, rows, value_sum FROM rollup ORDER BY ALL").fetchall()
    assert [(d, n) for d, n, _ in got] == [(d, n) for d, n, _ in expected]
    assert [s for *_, s in got] == pytest.approx([s for *_, s in expected])


def test_rules_in_historical_mode_never_reach_the_alarm_topic(cloud: Cloud, readings, monkeypatch):
    """The live path's alarms reach an SQS queue subscribed to the SNS alarm topic; the workflow with
    ``evaluate_rules`` and the rollup handler then record backfill events, and the queue stays empty."""
    from datetime import timedelta

    from tests.cloud.conftest import _Context, load_function
    from tests.conftest import SCHEMA
    from tests.followup.rules_reference import day, heat, recorded, reference

    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    topic = sns.create_topic(Name="timelake-alarms")["TopicArn"]
    alarms = sqs.create_queue(QueueName="pager")["QueueUrl"]
    alarms_arn = sqs.get_queue_attributes(QueueUrl=alarms, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=alarms_arn, Attributes={"RawMessageDelivery": "true"})
    config = cloud.config.model_copy(update={"alarms": f"sns://{topic}"})
    monkeypatch.setenv("TIMELAKE_CONFIG", config.model_dump_json())
    lake = timelake.Lake(compose(config))
    table = lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                              partition_by="day", retention="P3Y", rules=["hot: value > 80 for PT20M severity critical",
                                                                          "cold: value < 4"])
    table.append(heat(readings(recent(10), days=1, devices=2, step_minutes=10, seed=1), "d00", day(10), day(10) + timedelta(hours=1)))
    live = reference(table.to_arrow())
    live_alarms = _received(alarms, len(live))
    assert sorted((m["rule"], m["device_id"]) for m in live_alarms) == sorted((e[0], e[1]) for e in live)  # the alarm path is wired
    assert "hot" in {m["rule"] for m in live_alarms}
    published = _subscribe_queue()
    source = heat(readings(recent(8), days=2, devices=2, step_minutes=10, seed=3), "d01", day(7), day(7) + timedelta(hours=2))
    _upload(source, "src/a.parquet")
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet", "evaluate_rules": True, "publish_by": "day"}
    assert cloud.run(job, "bf-rules")["status"] == "SUCCEEDED"
    events = _received(published, 2)
    assert len(events) == 2 and all(e["detail"]["evaluate_rules"] for e in events)
    rollup = load_function("rollup").handler
    counts = [rollup(event, _Context("timelake-rollup"))["events"] for event in events]
    rollup(events[0], _Context("timelake-rollup"))  # a redelivered event changes nothing
    expected = reference(table.to_arrow(), day(8), day(6))
    assert recorded(table, "backfill") == expected and sum(counts) == len(expected) and expected
    assert sqs.receive_message(QueueUrl=alarms, WaitTimeSeconds=0).get("Messages", []) == []


def test_over_the_reject_budget_the_workflow_fails_before_it_writes(cloud: Cloud, readings):
    """The same budget on AWS: a third of the values unreadable ends the execution at the cut, with the
    budget's message; no unit is written, no lease taken, main untouched."""
    table = sensor_table(cloud.lake)
    source = readings(recent(6), days=1, devices=2)
    text = [f"{v:,.1f}" if i % 3 == 0 and v >= 1 else f"{v:.1f}" for i, v in enumerate(
        v * 1000 for v in source.column("value").to_pylist())]
    unreadable = sum("," in v for v in text)
    _upload(source.set_column(2, "value", pa.array(text)), "src/grouped.parquet")
    result = cloud.run({"table": "iot.sensor", "source": f"s3://{BUCKET}/src/*.parquet", "on_bad_value": "reject"},
                       "bf-over-budget")
    assert result["status"] == "FAILED" and "reject_budget" in result["cause"], result
    record = cloud.lake.job("bf-over-budget").record()
    assert record.phase == "failed_validation"
    assert f"{unreadable:,} of {source.num_rows:,} source rows" in record.state["error"] and "--thousands ','" in record.state["error"]
    assert cloud.invocations.count("timelake-write") == 0 and cloud.lake.leases("iot.sensor") == []
    assert table.refresh().iceberg.current_snapshot() is None
