"""Shared fixtures: a fresh embedded lake per test and a sensor-data generator."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import timelake

SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])
Readings = Callable[..., pa.Table]


def make_readings(start: str | datetime, days: float = 1, devices: int = 3, step_minutes: int = 60, seed: int = 0,
                  value_offset: float = 0.0) -> pa.Table:
    """Rows for every device on a fixed cadence from ``start`` (UTC) for ``days``."""
    begin = start if isinstance(start, datetime) else datetime.fromisoformat(start).replace(tzinfo=UTC)
    n = int(days * 24 * 60 // step_minutes)
    base = np.datetime64(begin.replace(tzinfo=None), "us")
    ts = np.tile(base + np.arange(n) * np.timedelta64(step_minutes * 60_000_000, "us"), devices)
    dev = np.repeat([f"d{i:02d}" for i in range(devices)], n)
    rng = np.random.default_rng(seed)
    value = np.round(rng.uniform(0, 100, n * devices), 3) + value_offset
    return pa.table({"ts": pa.array(ts).cast(SCHEMA.field("ts").type), "device_id": dev, "value": value}, schema=SCHEMA)


@pytest.fixture
def readings() -> Readings:
    return make_readings


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    return tmp_path / "lake"


@pytest.fixture
def lake(warehouse: Path) -> timelake.Lake:
    return timelake.connect(warehouse=warehouse)


@pytest.fixture
def sensor(lake: timelake.Lake) -> timelake.Table:
    """An empty day-partitioned iot.sensor table with a 3-year retention."""
    return lake.create_table("iot.sensor", schema=SCHEMA, time_column="ts", series_key=["device_id"],
                             partition_by="day", retention="P3Y", target_file_size="64MB")


#: The day the test session started (UTC): every `recent` day counts back from it, so a run that
#: crosses midnight does not see two different "todays" (rows made before midnight for a range asked after).
TODAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def recent(days_ago: int) -> str:
    """An ISO day ``days_ago`` before the session's day (UTC): keeps test data inside retention whatever the date."""
    return (TODAY - timedelta(days=days_ago)).strftime("%Y-%m-%d")


def reference_merge(existing: pa.Table, source: pa.Table) -> pa.Table:
    """Independent reference for merge: source duplicates collapse to their last row, existing rows win."""
    con = duckdb.connect()
    con.register("existing", existing)
    con.register("source", source.append_column("__pos", pa.array(np.arange(source.num_rows))))
    return con.sql("""
        WITH last AS (SELECT * EXCLUDE (__pos, __rank) FROM (
            SELECT *, row_number() OVER (PARTITION BY device_id, ts ORDER BY __pos DESC) AS __rank FROM source)
            WHERE __rank = 1)
        SELECT ts, device_id, value FROM existing
        UNION ALL
        SELECT ts, device_id, value FROM last ANTI JOIN existing USING (device_id, ts)
        ORDER BY device_id, ts""").to_arrow_table().cast(SCHEMA)


def after_replace(existing: pa.Table, fresh: pa.Table, start: str, end: str) -> pa.Table:
    """The rows a replace of the days [start, end) with ``fresh`` (no repeated keys) leaves, sorted: ``existing``
    outside the range, ``fresh`` inside it."""
    kind = SCHEMA.field("ts").type
    lo, hi = (pa.scalar(pc.strptime(day, "%Y-%m-%d", "us").as_py(), kind) for day in (start, end))
    inside = pc.and_(pc.greater_equal(existing.column("ts"), lo), pc.less(existing.column("ts"), hi))
    return sort_rows(pa.concat_tables([existing.filter(pc.invert(inside)).select(SCHEMA.names).cast(SCHEMA),
                                       fresh.select(SCHEMA.names).cast(SCHEMA)]))


def sort_rows(table: pa.Table) -> pa.Table:
    return table.select(SCHEMA.names).cast(SCHEMA).sort_by([("device_id", "ascending"), ("ts", "ascending")])


def duplicate_keys(table: pa.Table) -> int:
    counts = table.group_by(["device_id", "ts"]).aggregate([([], "count_all")]).column("count_all")
    return sum(1 for c in counts.to_pylist() if c > 1)


def stage_job(lake: timelake.Lake, source: pa.Table, table: str = "iot.sensor") -> str:
    """Drive a job's steps one by one up to a staged branch (no validation, no publish); its id."""
    from timelake.model.spec import JobSpec
    from timelake.steps.diff import pending_main_tasks, read_main
    from timelake.steps.plan import cut, pending_pieces, plan, scan
    from timelake.steps.stage import stage
    from timelake.steps.write import write_unit

    rt = lake.runtime
    job = lake.create_job(JobSpec(table=table, source="<pyarrow.Table>"))
    plan(rt, job.id, source)
    for task in pending_pieces(rt, job.id):
        scan(rt, job.id, task, source)
    cut(rt, job.id)
    for task in pending_main_tasks(rt, job.id):  # the job's diff reads main's range before the units write
        read_main(rt, job.id, task)
    for unit in rt.store.units(job.id):
        write_unit(rt, job.id, unit.unit_id)
    stage(rt, job.id)
    return job.id


TIMELAKE = str(Path(sys.executable).parent / "timelake")


def cli(*args: str, warehouse: Path, check: bool = True, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """``timelake ARGS`` with TIMELAKE_WAREHOUSE and ``env`` set (None: unset) for the call, through the
    console script's entry point in this process (`cli_main`): what a user sees, without the 1.3 s a new
    process spends importing pyiceberg and pyarrow. The tests of what only a process shows (umask, signals,
    a terminal, the environment a command inherits) run ``TIMELAKE``."""
    settings = {"TIMELAKE_WAREHOUSE": str(warehouse), **(env or {})}
    previous = {name: os.environ.get(name) for name in settings}
    try:
        _set_environ(settings)
        code, out, err = cli_main(*args)
    finally:
        _set_environ(previous)
    if check and code != 0:
        raise AssertionError(f"exit {code}: {err}")
    return subprocess.CompletedProcess([TIMELAKE, *args], code, out, err)


def _set_environ(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def cli_in_process(*args: str) -> tuple[int, str]:
    """``timelake ARGS`` through its entry point in this process: (exit code, stderr). Faster than a
    subprocess, and what a user sees, since main() is where a failure becomes one line."""
    code, _, err = cli_main(*args)
    return code, err


def cli_main(*args: str) -> tuple[int, str, str]:
    """``timelake ARGS`` as the command runs it, in this process (its umask left alone): (exit code,
    stdout, stderr)."""
    import contextlib
    import io

    from timelake.interfaces.cli import run_cli

    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["timelake", *args]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            run_cli()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()
