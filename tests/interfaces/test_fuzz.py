"""Fuzzed job documents, generated from docs/job.schema.json and mutated, through the model, the CLI (in
process, with a time cap per document) and the API handler (API Gateway proxy events against moto).

Every document must end as a result or one clean error: no traceback, no 5xx, no hang, and main of the
existing table unchanged by every failure. Derandomized, so a CI run is the same run every time.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from pydantic import ValidationError

import timelake
from tests.aws_fixtures import aws, moto_server  # noqa: F401
from tests.cloud.conftest import _Context, cloud, load_function  # noqa: F401
from tests.conftest import SCHEMA, cli_in_process, recent
from timelake.model.spec import JobSpec

DOCUMENTS = int(os.environ.get("TIMELAKE_FUZZ_DOCUMENTS", "1000"))
CAP_SECONDS = 20
RUNNABLE = int(os.environ.get("TIMELAKE_FUZZ_RUNNABLE", "40"))  # about one document in RUNNABLE + 1 is a job that runs
CSV = "fuzz-source.csv"  # written in the test's working directory
JOB_SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "job.schema.json").read_text())

TRICKY: dict[str, list[Any]] = {
    "table": ["iot.", "..", ".x", "iot.sensor", "iot.nope", "a\x1b[31m.b", "", 5],
    "source": ["", " ", "<memory>", "<pyarrow.Table 3 rows>", "postgresql://u:pw@h/db", "postgresql://u:p/w@h/db",
               "postgresql://u:p#w@h/db", "postgresql://h/db?table=t&password=s", "influxdb://h?db=x", "duckdb:",
               "/dev/null", "/", "no/such/*.csv", "iceberg://iot.sensor", True],
    "tz": ["Mars/Olympus", "", "../etc/passwd", "UTC", "Europe/Berlin", 7],
    "start": ["9999-12-31T23:00", "0001-01-01", "2024-13-01", "", 1700000000, True, "2024-01-01"],
    "end": ["9999-12-31T23:00", "10000-01-01", "2024-01-02", "0001-01-01T00:00:00+05:00"],
    "max_concurrency": [True, False, 0, -1, 10**30, 1.5, "8"],
    "approval_timeout_seconds": [True, 0, 10**12],
    "source_rows_per_second": [True, -1, 2**70],
    "assertion_timeout": [True, 0, 10**9],
    "assertions": [[""], ["SELECT 1"] * 101, ["x" * 70_000], "SELECT 1", [1]],
    "canary": [1, 0, "2024-02-30", "first", True],
    "map": [{"ts": 1}, [], {"": ""}],
    "mode": ["upsert", None, True],
    "dry_run": [1, "yes", None],
    "run_between": ["24:00-06:00", "22:00-22:00", "22-06", "", " ", "22:00-06:00\x1b[0m", 2200],  # none a window
    "run_tz": ["Mars/Olympus", "", "UTC", 1],
}
SCHEMA_VALID = from_schema(JOB_SCHEMA)  # built once: building it canonicalises the whole schema (~30 ms)
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=8)


@st.composite
def documents(draw: Any) -> Any:
    """Schema-valid documents, and those with one to three fields mutated, dropped or added; a few non-objects."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from([[], None, "job", 3, [{"table": "iot.sensor"}]]) | JSON_VALUES)
    doc = dict(draw(SCHEMA_VALID))
    if draw(st.integers(0, RUNNABLE)) == 7:  # a job that can run (not 0: Hypothesis favours it): the existing table and a readable source, the rest generated
        doc.update(table="iot.sensor", source=CSV)
        for key in ("start", "end", "canary", "query", "format", "time_unit", "precision", "tz", "map", "assertions",
                    "run_between", "run_tz"):  # quiet hours closed now would make the job wait for them
            doc.pop(key, None)
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.integers(0, 9))
        if how < 6:
            key = draw(st.sampled_from(sorted(TRICKY)))
            doc[key] = draw(st.sampled_from(TRICKY[key]))
        elif how < 8:
            doc[draw(st.sampled_from(sorted(JOB_SCHEMA["properties"])))] = draw(JSON_VALUES)
        elif doc:
            doc.pop(draw(st.sampled_from(sorted(doc))))
        else:
            doc[draw(st.text(max_size=8))] = draw(JSON_VALUES)
    return doc


class _Hang(Exception):
    pass


def _capped(fn: Any) -> Any:
    """Run ``fn`` with a wall-clock cap (SIGALRM: the test runs in the main thread)."""
    def expire(signum: int, frame: Any) -> None:
        raise _Hang

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(CAP_SECONDS)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _event(body: str) -> dict[str, Any]:
    return {"resource": "/backfills", "path": "/backfills", "httpMethod": "POST",
            "headers": {"Content-Type": "application/json"}, "multiValueHeaders": {}, "queryStringParameters": None,
            "multiValueQueryStringParameters": None, "pathParameters": None, "stageVariables": None,
            "isBase64Encoded": False, "body": body,
            "requestContext": {"httpMethod": "POST", "path": "/backfills", "stage": "prod", "requestId": "r1",
                               "identity": {"userArn": "arn:aws:iam::123456789012:user/tester"}}}


@pytest.mark.slow
def test_fuzzed_documents_end_cleanly(cloud, tmp_path, monkeypatch, readings):  # noqa: F811
    monkeypatch.setenv("STATE_MACHINE_ARN", cloud.state_machine_arn)
    api = load_function("api")
    warehouse = tmp_path / "lake"
    monkeypatch.setenv("TIMELAKE_WAREHOUSE", str(warehouse))
    table = timelake.connect(warehouse=warehouse).create_table(
        "iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day")
    table.append(readings(recent(20), days=1, devices=1))
    monkeypatch.chdir(tmp_path)
    (tmp_path / CSV).write_text("ts,device_id,value\n" + "".join(
        f"{recent(30)}T{h:02d}:00:00Z,fuzz-{d},{h}.5\n" for d in range(2) for h in range(24)))
    main = {"before": table.refresh().iceberg.metadata.refs["main"].snapshot_id}
    counts: Counter[str] = Counter()
    problems: list[str] = []

    @settings(max_examples=DOCUMENTS, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(documents())
    def check(doc: Any) -> None:
        counts["documents"] += 1
        text = json.dumps(doc)
        try:
            JobSpec.model_validate(doc)
            counts["model accepts"] += 1
        except ValidationError:
            counts["model refuses"] += 1
        path = tmp_path / "job.json"
        path.write_text(text)
        named = doc.get("table") if isinstance(doc, dict) and isinstance(doc.get("table"), str) else "iot.sensor"
        try:
            code, err = _capped(lambda: cli_in_process("backfill", named or "x.y", "--job", str(path)))
        except _Hang:
            counts["cli hangs"] += 1
            problems.append(f"hang: {text[:300]}")
            return
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        if "Traceback" in err or (code == 1 and len(errors) != 1) or code not in (0, 1, 2):
            counts["cli tracebacks"] += 1
            problems.append(f"cli {code}: {err[-500:]} for {text[:300]}")
        counts["cli clean errors" if code else "cli successes"] += 1
        main_now = table.refresh().iceberg.metadata.refs["main"].snapshot_id
        if code and main_now != main["before"]:
            problems.append(f"main changed by a failure: {text[:300]}")
        main["before"] = main_now
        try:
            status = _capped(lambda: api.handler(_event(text), _Context("timelake-api"))["statusCode"])
        except _Hang:
            counts["api hangs"] += 1
            problems.append(f"api hang: {text[:300]}")
            return
        except Exception as exc:  # an unhandled exception is a 502 from API Gateway
            status = 502
            problems.append(f"api raised {type(exc).__name__}: {exc} for {text[:300]}")
        counts[f"api {status // 100}xx"] += 1
        if status >= 500:
            problems.append(f"api {status} for {text[:300]}")

    check()
    print("fuzz counts:", dict(sorted(counts.items())))
    assert counts["documents"] >= DOCUMENTS
    assert problems == [], problems[:10]
