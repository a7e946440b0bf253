"""`timelake demo`: the product in two minutes on a laptop.

A live `iot.sensor` table with recent data and a month-long gap a year back, a historian export of
that month in local (Europe/Berlin) time with other column names, a dry run, then the backfill with
a progress bar while a live writer keeps appending, then the checks and the coverage before/after.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Console
from rich.text import Text

from timelake.followup import heatmap
from timelake.followup.coverage import EXPECTED_INTERVAL, EXPECTED_SERIES
from timelake.followup.heatmap import terminal
from timelake.interfaces.console import drive, print_report
from timelake.interfaces.lake import Table, connect
from timelake.model.spec import JobSpec

DEVICES = 24
STEP = timedelta(minutes=5)
console = Console()


def readings(start: datetime, end: datetime, step: timedelta = STEP, devices: int = DEVICES, seed: int = 0) -> pa.Table:
    """Synthetic sensor rows for every device on a fixed cadence in [start, end)."""
    n = int((end - start) / step)
    base = np.datetime64(start.replace(tzinfo=None), "us")
    ts = np.tile(base + np.arange(n) * np.timedelta64(int(step.total_seconds() * 1e6), "us"), devices)
    dev = np.repeat([f"dev-{i:03d}" for i in range(devices)], n)
    rng = np.random.default_rng(seed)
    value = 20 + 5 * np.sin(np.arange(n * devices) / 500) + rng.normal(0, 0.5, n * devices)
    return pa.table({"ts": pa.array(ts).cast(pa.timestamp("us", tz="UTC")), "device_id": dev, "value": value})


def coverage(table: Table, start: datetime, days: int) -> Text:
    """The calendar heatmap of `timelake coverage` (from the table's metadata) over ``days`` from ``start``."""
    return terminal(table.refresh().coverage_map(start, start + timedelta(days=days)))


def run_demo(warehouse: Path) -> None:
    shutil.rmtree(warehouse, ignore_errors=True)
    lake = connect(warehouse=warehouse)
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])
    table = lake.create_table("iot.sensor", schema=schema, time_column="ts", series_key=["device_id"],
                              partition_by="day", retention="P3Y", target_file_size="8MB",
                              properties={EXPECTED_INTERVAL: f"PT{int(STEP.total_seconds() // 60)}M", EXPECTED_SERIES: str(DEVICES)})
    gap_start, gap_end = today - timedelta(days=360), today - timedelta(days=330)
    for lo, hi in ((today - timedelta(days=375), gap_start), (gap_end, today - timedelta(days=320)),
                   (today - timedelta(days=2), today)):
        table.append(readings(lo, hi, seed=lo.toordinal()))
    console.rule("live table iot.sensor before the backfill")
    window = today - timedelta(days=380)
    console.print(coverage(table, window, 70), end="", soft_wrap=True)

    export = warehouse / "historian-export"
    export.mkdir(parents=True)
    history = readings(gap_start - timedelta(days=2), gap_end + timedelta(days=2), seed=7)
    # historian exports hold naive local (Europe/Berlin) wall-clock time
    naive = pc.local_timestamp(pc.cast(history.column("ts"), pa.timestamp("us", tz="Europe/Berlin")))
    renamed = pa.table({"timestamp": naive, "tag_name": history.column("device_id"), "val": history.column("value")})
    day = pc.cast(pc.floor_temporal(naive, unit="day"), pa.date32())
    for d in pc.unique(day).to_pylist():
        pq.write_table(renamed.filter(pc.equal(day, d)), export / f"{d}.parquet")
    console.rule(f"historian export: {renamed.num_rows:,} rows in {len(list(export.iterdir()))} daily Parquet files, local time")

    spec = dict(table="iot.sensor", source=f"{export}/*.parquet", map={"ts": "timestamp", "device_id": "tag_name", "value": "val"},
                tz="Europe/Berlin", dst_policy="earliest", max_concurrency=2)
    dry = lake.submit(JobSpec.model_validate({**spec, "dry_run": True}), wait=True)
    console.rule("dry run: nothing changes")
    print_report(dry.report())

    stop = threading.Event()
    live_rows = _live_writer(table, today, stop)
    console.rule("backfill (a live writer appends every 200 ms meanwhile)")
    job = lake.create_job(JobSpec.model_validate(spec))
    try:
        drive(lake, job.id, as_json=False)
    finally:
        stop.set()
    appended = live_rows()
    result = table.refresh().to_arrow()
    console.rule("after")
    console.print(coverage(table, window, 70), end="", soft_wrap=True)
    keys = result.group_by(["device_id", "ts"]).aggregate([([], "count_all")])
    console.print(f"  rows on main: {result.num_rows:,}; duplicate keys: {sum(1 for c in keys.column('count_all').to_pylist() if c > 1)}; "
                  f"live rows appended during the backfill: {appended:,}, all on main: {_live_count(result, today) == appended}")
    signal = table.coverage()
    statuses = dict(zip(*signal.group_by("status").aggregate([([], "count_all")]).to_pydict().values(), strict=True))
    page = warehouse / "coverage.html"
    page.write_text(heatmap.page(table.coverage_map(window, window + timedelta(days=70))))
    console.print(f"  completion signal {table.name}__coverage (written by the publish): "
                  f"{', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))} partition(s); the same picture as a page: {page}")


def _live_writer(table: Table, today: datetime, stop: threading.Event) -> Callable[[], int]:
    """A thread that appends one minute of readings for every device every 200 ms, like live ingestion."""
    appended = [0]
    state = {"t": today}

    def loop() -> None:
        live = Table(table.lake, table.lake.runtime.load_table(table.name))
        while not stop.wait(0.2):
            batch = readings(state["t"], state["t"] + timedelta(minutes=1), step=timedelta(minutes=1), seed=appended[0])
            live.append(batch)
            appended[0] += batch.num_rows
            state["t"] += timedelta(minutes=1)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()

    def finish() -> int:
        stop.set()
        thread.join()
        return appended[0]

    return finish


def _live_count(result: pa.Table, today: datetime) -> int:
    """Rows from today on: only the live writer wrote those."""
    ts = pc.cast(result.column("ts"), pa.int64()).to_numpy()
    return int((ts >= int(today.timestamp() * 1e6)).sum())
