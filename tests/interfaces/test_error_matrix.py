"""The one-line error matrix: every way a command fails for a reason outside the engine (a DuckDB query
failing mid-stream, no AWS region or credentials, unreadable files, an unknown job) goes through the
real CLI and ends in ONE ``error:`` line that names what is wrong: no traceback, nothing else but the
job's own progress lines."""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import TIMELAKE, recent
from timelake.model.report import STEPS

MAX_LINE = 300  # DuckDB's own message for a bad CSV cell runs to 1,500 characters over 30 lines

#: a query whose rows stream in batches until row 250,000, which cannot be converted: the failure
#: arrives mid-stream, through Arrow's C stream, as a plain OSError
MID_STREAM = (f"SELECT TIMESTAMPTZ '{recent(20)} 00:00:00+00' + to_seconds(i) AS ts, 'd1' AS device_id, "
              "(CASE WHEN i < 250000 THEN i::VARCHAR ELSE 'x' || i END)::DOUBLE AS value FROM range(300000) t(i)")

NO_AWS = {"AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
          "AWS_EC2_METADATA_DISABLED": "true"}


def run(args: list[str], warehouse: Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``timelake ARGS`` with the environment's AWS and timelake settings left out, plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIMELAKE_"))}
    return subprocess.run([TIMELAKE, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**base, "TIMELAKE_WAREHOUSE": str(warehouse), **(env or {})})


@pytest.fixture
def files(tmp_path, readings) -> Path:
    """Sources that cannot be read: a Parquet file corrupt in its middle, a gzip CSV cut short."""
    rows = readings(recent(30), days=20, devices=20, step_minutes=5)
    pq.write_table(rows, tmp_path / "whole.parquet", row_group_size=20_000)
    data = bytearray((tmp_path / "whole.parquet").read_bytes())
    middle = len(data) // 2
    data[middle:middle + 20_000] = bytes(20_000)
    (tmp_path / "corrupt.parquet").write_bytes(bytes(data))
    csv = b"ts,device_id,value\n" + b"".join(f"{recent(9)}T00:{i % 60:02d}:00Z,d{i},{i}\n".encode() for i in range(50_000))
    (tmp_path / "cut.csv.gz").write_bytes(gzip.compress(csv)[:20_000])
    return tmp_path


CASES = {
    "duckdb query failing mid-stream": (
        ["backfill", "iot.sensor", "--from-sql", MID_STREAM],
        None, "the source query failed: Conversion Error: Could not convert string 'x250000' to DOUBLE"),
    "duckdb query reading a missing file": (
        ["backfill", "iot.sensor", "--from-sql", "SELECT * FROM read_csv('missing.csv')"],
        None, 'the source query failed: IO Error: No files found that match the pattern "missing.csv"'),
    "parquet file corrupt in its middle": (
        ["backfill", "iot.sensor", "--from", "corrupt.parquet"], None, "corrupt.parquet is not a readable Parquet file"),
    "gzip csv cut short": (
        ["backfill", "iot.sensor", "--from", "cut.csv.gz"], None, "cut.csv.gz is not a readable CSV file"),
    "--on aws without a region": (
        ["backfill", "iot.sensor", "--from", "s3://bucket/x.parquet", "--on", "aws"], NO_AWS,
        "no AWS region: set AWS_DEFAULT_REGION"),
    "--on aws without credentials": (
        ["backfill", "status", "bf-1", "--on", "aws"], NO_AWS | {"AWS_DEFAULT_REGION": "eu-west-1"},
        "no AWS credentials: set AWS_PROFILE"),
    "--on aws with an unknown profile": (
        ["backfill", "resume", "bf-1", "--on", "aws"],
        NO_AWS | {"AWS_DEFAULT_REGION": "eu-west-1", "AWS_PROFILE": "nope"},
        "AWS credentials: The config profile (nope) could not be found"),
    "status of an unknown job": (["backfill", "status", "bf-nope"], None, "no backfill job 'bf-nope'"),
    "resume of an unknown job": (["backfill", "resume", "bf-nope"], None, "no backfill job 'bf-nope'"),
    "abort of an unknown job": (["backfill", "abort", "bf-nope"], None, "no backfill job 'bf-nope'"),
    "continue of an unknown job": (["backfill", "continue", "bf-nope"], None, "no backfill job 'bf-nope'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_failure_is_one_line_naming_what_is_wrong(sensor, warehouse, files, case):
    args, env, message = CASES[case]
    result = run(args, warehouse, files, env)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and len(errors[0]) < MAX_LINE, result.stderr
    others = [line for line in result.stderr.splitlines() if not line.startswith(("error:", "job "))]
    assert all(line.split(" ")[0].rstrip(":") in STEPS for line in others), others  # the job's step lines only
    assert "None" not in result.stdout  # a failed job's report leaves out what it never learned
