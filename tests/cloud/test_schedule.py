"""Quiet hours and settings mid-job on moto's Step Functions, running the real workflow file and handlers.

Quiet hours: the Lambdas read a clock the test controls (`tests.clock.TestClock` on the handlers'
runtime); when it leaves the window, a write item answers ``resume_at`` and its own child execution
waits in a Wait state (moto waits on the real clock: the test clock makes that two seconds and jumps
to the window's opening meanwhile), so the parent's history gains nothing for a Map's pause; publish
waits in the parent's Wait state, which adds its Wait, one Publish and one Choice.

Settings: ``POST /backfills/{id}/settings`` during the scan Map updates that running Map run
(UpdateMapRun) and the write Map starts with the new MaxConcurrency. moto records UpdateMapRun
(DescribeMapRun shows it) but keeps a running Map's worker threads as they started, so the effect is
measured on the next Map: the write Lambdas running at once.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from tests.clock import TestClock
from tests.cloud.conftest import BUCKET, ROOT, Cloud, sensor_table
from tests.cloud.test_api import api  # noqa: F401
from tests.cloud.test_limits import EVENTS_PER_STATE, expected_events, history
from tests.cloud.test_workflow import _upload
from tests.conftest import SCHEMA, make_readings, recent, reference_merge, sort_rows
from timelake.adapters import runtime_for
from timelake.adapters.local import SystemClock
from timelake.errors import JobNotFound
from timelake.interfaces.orchestrator import StepFunctionsOrchestrator

BERLIN = "Europe/Berlin"
WAIT_EVENTS = 2  # WaitStateEntered, WaitStateExited


def at(local: str) -> float:
    return datetime.fromisoformat(local).replace(tzinfo=ZoneInfo(BERLIN)).timestamp()


@pytest.fixture
def clock(cloud: Cloud) -> Iterator[TestClock]:
    """The test clock on the runtime the handlers use (one per config per process). moto's Wait state
    compares a UTC timestamp with the local time, so the process runs in UTC while the test does."""
    zone = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    rt = runtime_for(cloud.config)
    rt.clock = TestClock(at("2030-01-07T05:50"))
    try:
        yield rt.clock
    finally:
        rt.clock = SystemClock()
        if zone is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = zone
        time.tzset()


def test_quiet_hours_pause_the_write_map_and_publish_and_the_history_stays_bounded(cloud: Cloud, clock: TestClock):
    sensor_table(cloud.lake)
    source = make_readings(recent(8), days=5, devices=3)  # five day units
    _upload(source, "src/a.parquet")
    orchestrator = StepFunctionsOrchestrator(cloud.lake.runtime, cloud.state_machine_arn, cloud.sfn)
    writes, publishes, seen = [], [], {}

    def before_write(event: dict) -> None:
        if len(writes) == 2:  # two units are written; the window closes before the third
            clock.advance_to(at("2030-01-07T06:00:30"))
        writes.append(clock.now())  # what the handler is about to see
        if len(writes) == 4:  # the same item after its Wait: the window has opened
            seen["write"] = orchestrator.status(event["job_id"])

    def before_publish(event: dict) -> None:
        if not publishes:  # validated at 22:00; publish comes after the next morning's close
            clock.advance_to(at("2030-01-08T06:00:30"))
        publishes.append(clock.now())
        if len(publishes) == 2:
            seen["publish"] = (orchestrator.status(event["job_id"]), cloud.lake.table("iot.sensor").to_arrow().num_rows)

    cloud.before["timelake-write"] = before_write
    cloud.before["timelake-publish"] = before_publish
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/a.parquet", "run_between": "22:00-06:00",
           "run_tz": BERLIN, "max_concurrency": 1}
    result = cloud.run(job, "bf-quiet", timeout=120)
    assert result["status"] == "SUCCEEDED", result

    assert seen["write"]["paused_until"] == "2030-01-07T22:00:00+01:00" and seen["write"]["units_done"] == 2
    assert seen["write"]["execution"]["status"] == "RUNNING"
    status, rows_on_main = seen["publish"]
    assert status["paused_until"] == "2030-01-08T22:00:00+01:00" and status["phase"] == "validated"
    assert rows_on_main == 0  # nothing reached main while it waited
    assert writes == [at("2030-01-07T05:50")] * 2 + [at("2030-01-07T06:00:30")] + [at("2030-01-07T22:00")] * 3
    assert publishes == [at("2030-01-08T06:00:30"), at("2030-01-08T22:00")]
    state = cloud.lake.runtime.store.get_job("bf-quiet").state
    assert state["pauses"] == [[at("2030-01-07T06:00:30"), at("2030-01-07T22:00")],
                               [at("2030-01-08T06:00:30"), at("2030-01-08T22:00")]]
    expected = sort_rows(reference_merge(SCHEMA.empty_table(), source))
    assert sort_rows(cloud.lake.table("iot.sensor").to_arrow()).equals(expected)

    # The parent's history: the Map's pause adds nothing, the publish pause its Wait and one more pass of
    # the publish loop, as docs/aws.md counts them.
    events = history(cloud, result["executionArn"])
    waits = [e for e in events if e["type"] == "WaitStateEntered"]
    assert [e["stateEnteredEventDetails"]["name"] for e in waits] == ["Wait to publish"]
    fixed, per_publish = expected_events(1)
    assert len(events) == fixed + per_publish * len(publishes) + WAIT_EVENTS * len(waits)
    documented = re.search(r"events = (\d+) \+ (\d+) \* P \+ (\d+) \* W", (ROOT / "docs" / "aws.md").read_text())
    assert documented and (int(documented[1]), int(documented[2]), int(documented[3])) == (fixed, per_publish, WAIT_EVENTS)
    assert EVENTS_PER_STATE["Task"] + EVENTS_PER_STATE["Choice"] == per_publish


def test_a_diffs_main_tasks_wait_for_quiet_hours_like_the_units(cloud: Cloud, clock: TestClock):
    """A merge job into days main holds: the write Map runs its diff's main tasks (main's rows of the
    range) before the units. The window closes before the first main task, whose item waits in its own
    Wait state like a unit's; nothing reads main or writes until the window opens, and the diff counts
    main's rows once."""
    sensor_table(cloud.lake)
    existing = make_readings(recent(8), days=2, devices=3)
    cloud.lake.table("iot.sensor").append(existing)
    source = make_readings(recent(8), days=3, devices=3, seed=1)  # main's two days again (other values), and a new one
    _upload(source, "src/a.parquet")
    calls: list[tuple[str, float]] = []

    def before_write(event: dict) -> None:
        if not calls:
            clock.advance_to(at("2030-01-07T06:00:30"))
        calls.append(("main" if "main_task" in event else "unit", clock.now()))

    cloud.before["timelake-write"] = before_write
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/a.parquet", "run_between": "22:00-06:00",
           "run_tz": BERLIN, "max_concurrency": 1}
    result = cloud.run(job, "bf-quiet-diff", timeout=120)
    assert result["status"] == "SUCCEEDED", result

    mains = [when for kind, when in calls if kind == "main"]
    units = [when for kind, when in calls if kind == "unit"]
    assert calls[0][0] == "main" and mains == [at("2030-01-07T06:00:30")] + [at("2030-01-07T22:00")] * (len(mains) - 1)
    assert len(mains) >= 2 and len(units) == 3 and set(units) == {at("2030-01-07T22:00")}
    found = cloud.lake.job("bf-quiet-diff").diff()
    assert found["totals"]["rows_before"] == found["totals"]["in_both"] == existing.num_rows
    assert found["totals"]["only_after"] == source.num_rows - existing.num_rows
    assert sort_rows(cloud.lake.table("iot.sensor").to_arrow()).equals(sort_rows(reference_merge(existing, source)))


def test_settings_set_during_the_scan_map_update_it_and_start_the_write_map_with_them(cloud: Cloud, api):  # noqa: F811
    sensor_table(cloud.lake)
    source = make_readings(recent(10), days=6, devices=3)  # six day units
    _upload(source, "src/a.parquet")
    answers = []

    def before_scan(event: dict) -> None:
        if not answers:
            answers.append(api("POST", f"/backfills/{event['job_id']}/settings",
                               {"max_concurrency": 3, "source_rows_per_second": 50_000}))

    def before_write(event: dict) -> None:
        time.sleep(0.3)  # units started together overlap

    cloud.before["timelake-scan"] = before_scan
    cloud.before["timelake-write"] = before_write
    job = {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/a.parquet", "max_concurrency": 1}
    result = cloud.run(job, "bf-settings", timeout=120)
    assert result["status"] == "SUCCEEDED", result

    (code, body), = answers
    assert code == 200 and body["settings"] == {"max_concurrency": 3, "source_rows_per_second": 50_000}
    assert body["map_runs_updated"] == ["ScanSource 3"]
    runs = {run["mapRunArn"].split("/")[-1].split(":")[0]: cloud.sfn.describe_map_run(mapRunArn=run["mapRunArn"])
            for run in cloud.sfn.list_map_runs(executionArn=result["executionArn"])["mapRuns"]}
    assert runs["ScanSource"]["maxConcurrency"] == 3  # UpdateMapRun on the running scan Map
    assert runs["WriteUnits"]["maxConcurrency"] == 3 and cloud.peaks["timelake-write"] == 3
    report = cloud.lake.job("bf-settings").report()
    assert report["source_limits"]["rows_per_second"] == 50_000
    assert sort_rows(cloud.lake.table("iot.sensor").to_arrow()).equals(sort_rows(reference_merge(SCHEMA.empty_table(), source)))

    code, body = api("POST", "/backfills/bf-settings/settings", {"max_concurrency": 2})
    assert code == 409 and body["message"] == "job bf-settings is published: settings change a job that has not finished"
    code, body = api("POST", "/backfills/bf-settings/settings", {"max_concurrency": 0})
    assert code == 422, body
    assert json.dumps(body).count("max_concurrency") >= 1


def test_an_execution_waiting_for_quiet_hours_is_aborted_at_once(cloud: Cloud, clock: TestClock):
    """The job starts outside its window: its scan item waits (a minute here); abort stops the execution
    in that Wait at once and the job ends aborted, holding nothing; main is untouched."""
    sensor_table(cloud.lake)
    existing = make_readings(recent(3), days=1, devices=3)
    cloud.lake.table("iot.sensor").append(existing)
    _upload(make_readings(recent(8), days=3, devices=3), "src/a.parquet")
    clock.advance_to(at("2030-01-07T12:00"))
    clock.workflow_wait = 60
    orchestrator = StepFunctionsOrchestrator(cloud.lake.runtime, cloud.state_machine_arn, cloud.sfn)
    arn = cloud.sfn.start_execution(stateMachineArn=cloud.state_machine_arn, name="bf-abort-paused", input=json.dumps(
        {"table": "iot.sensor", "source": f"s3://{BUCKET}/src/a.parquet", "run_between": "22:00-06:00", "run_tz": BERLIN}))["executionArn"]
    deadline = time.time() + 30
    while not _paused(orchestrator, "bf-abort-paused"):
        assert time.time() < deadline, "the job never paused"
        time.sleep(0.1)
    began = time.time()
    result = orchestrator.abort("bf-abort-paused")
    assert cloud.wait(arn, timeout=20)["status"] == "ABORTED" and time.time() - began < 20
    assert result["phase"] == "aborted" and cloud.lake.runtime.store.leases() == []
    status = orchestrator.status("bf-abort-paused")
    assert status["phase"] == "aborted" and status["paused_until"] is None
    assert sort_rows(cloud.lake.table("iot.sensor").to_arrow()).equals(sort_rows(existing))


def _paused(orchestrator: StepFunctionsOrchestrator, job_id: str) -> bool:
    try:
        return bool(orchestrator.status(job_id).get("paused_until"))
    except JobNotFound:  # the Plan Lambda has not created the job record yet
        return False
