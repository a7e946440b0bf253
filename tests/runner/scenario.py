"""Shared scenario for the crash/resume and live-writer tests: a real lake, real Parquet, the real CLI.

The table is ``iot.sensor`` (ts, device_id, value), partitioned by day, dedup key (device_id, ts).
Expected results are computed here independently of the engine, with DuckDB over the same rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from timelake import connect
from timelake.interfaces.lake import Lake, Table

TABLE = "iot.sensor"
BRANCH_PREFIX = "backfill/"
JOB_PROPERTY = "timelake.job-id"
STEP_PROPERTY = "timelake.step"
CHUNK_PROPERTY = "timelake.chunk"
DEVICES = 4
STEP = timedelta(minutes=30)
RANGE_START = datetime(2024, 3, 1, tzinfo=UTC)
US_PER_DAY = 86_400_000_000
SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("device_id", pa.string()), ("value", pa.float64())])
TIMELAKE = Path(sys.executable).parent / "timelake"

Key = tuple[str, int]


def us(t: datetime) -> int:
    return int(t.timestamp()) * 1_000_000


def readings(start: datetime, days: float, value_base: float, devices: int = DEVICES, step: timedelta = STEP) -> pa.Table:
    """Every device on a fixed cadence in [start, start + days); values unique and counting up from value_base."""
    n = int(timedelta(days=days) / step)
    times = us(start) + np.arange(n, dtype=np.int64) * int(step.total_seconds() * 1_000_000)
    ts = np.tile(times, devices)
    dev = np.repeat([f"dev-{i}" for i in range(devices)], n)
    return table_of(ts, dev, value_base + np.arange(n * devices, dtype=np.float64))


def table_of(ts: Any, device_id: Any, value: Any) -> pa.Table:
    return pa.table({
        "ts": pa.array(np.asarray(ts, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
        "device_id": pa.array(list(device_id), pa.string()),
        "value": pa.array(np.asarray(value, dtype=np.float64)),
    })


def make_lake(tmp_path: Path) -> tuple[Lake, Path]:
    warehouse = tmp_path / "lake"
    return connect(warehouse=warehouse), warehouse


def create_table(lake: Lake) -> Table:
    return lake.create_table(TABLE, schema=SCHEMA, time_column="ts", series_key=["device_id"], partition_by="day")


def original_rows(days: int) -> pa.Table:
    """What main holds before the backfill: two days before the range, plus some rows inside it
    (all of dev-0 on the range's third day, the first six slots of dev-2 on its fifth day)."""
    before = readings(RANGE_START - timedelta(days=2), 2, value_base=1_000_000)
    slots = int(timedelta(days=1) / STEP)
    day3 = RANGE_START + timedelta(days=min(2, days - 1))
    day5 = RANGE_START + timedelta(days=min(4, days - 1))
    inside_a = table_of(us(day3) + np.arange(slots) * int(STEP.total_seconds() * 1e6), ["dev-0"] * slots,
                        2_000_000 + np.arange(slots))
    inside_b = table_of(us(day5) + np.arange(6) * int(STEP.total_seconds() * 1e6), ["dev-2"] * 6,
                        3_000_000 + np.arange(6))
    return pa.concat_tables([before, inside_a, inside_b])


def source_parts(days: int) -> list[pa.Table]:
    """The export, in file order: the readings with corrections appended (later rows win), then a
    second file of corrections, some of keys corrected already, some of keys that exist on main."""
    base = readings(RANGE_START, days, value_base=0)
    rng = np.random.default_rng(days)
    picks = rng.choice(base.num_rows, size=12, replace=False)
    fixes_a = table_of(pc.cast(base.column("ts").take(picks), pa.int64()).to_numpy(),
                       base.column("device_id").take(picks).to_pylist(), 500_000 + np.arange(12))
    part_a = pa.concat_tables([base, fixes_a])
    again = picks[:4]  # corrected in file a, corrected again in file b: file b wins
    existing = original_rows(days).slice(2 * DEVICES * 48, 3)  # keys already on main: main wins
    fixes_b = pa.concat_tables([
        table_of(pc.cast(base.column("ts").take(again), pa.int64()).to_numpy(),
                 base.column("device_id").take(again).to_pylist(), 600_000 + np.arange(4)),
        table_of(pc.cast(existing.column("ts"), pa.int64()).to_numpy(), existing.column("device_id").to_pylist(),
                 700_000 + np.arange(existing.num_rows)),
    ])
    return [part_a, fixes_b]


def write_source(directory: Path, parts: list[pa.Table]) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(parts):
        pq.write_table(part, directory / f"export-{i:02d}.parquet")
    return str(directory / "*.parquet")


def merge_reference(existing: pa.Table, parts: list[pa.Table]) -> pa.Table:
    """Merge mode, computed independently: every existing row, plus the LAST source row of each key
    that does not exist yet."""
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        src = pa.concat_tables(parts)
        src = src.append_column("rn", pa.array(np.arange(src.num_rows, dtype=np.int64)))
        con.register("existing", existing)
        con.register("src", src)
        result = con.sql("""
            SELECT ts, device_id, value FROM existing
            UNION ALL
            SELECT ts, device_id, value FROM (
                SELECT * FROM src QUALIFY row_number() OVER (PARTITION BY device_id, ts ORDER BY rn DESC) = 1
            ) s
            WHERE NOT EXISTS (SELECT 1 FROM existing e WHERE e.device_id = s.device_id AND e.ts = s.ts)
        """).to_arrow_table()
    finally:
        con.close()
    return canonical(result)


def canonical(rows: pa.Table) -> pa.Table:
    """The three columns with fixed types, sorted by (device_id, ts)."""
    out = pa.table({
        "ts": pc.cast(rows.column("ts"), pa.timestamp("us", tz="UTC")),
        "device_id": pc.cast(rows.column("device_id"), pa.string()),
        "value": pc.cast(rows.column("value"), pa.float64()),
    })
    return out.sort_by([("device_id", "ascending"), ("ts", "ascending")])


def keyed(rows: pa.Table) -> dict[Key, float]:
    """(device_id, ts µs) -> value; raises if a key occurs twice."""
    counts = key_counts(rows)
    dupes = [k for k, n in counts.items() if n > 1]
    assert not dupes, f"{len(dupes)} duplicate key(s), e.g. {dupes[:3]}"
    ts = pc.cast(rows.column("ts"), pa.int64()).to_pylist()
    return dict(zip(zip(rows.column("device_id").to_pylist(), ts, strict=True), rows.column("value").to_pylist(), strict=True))


def key_counts(rows: pa.Table) -> Counter:
    ts = pc.cast(rows.column("ts"), pa.int64()).to_pylist()
    return Counter(zip(rows.column("device_id").to_pylist(), ts, strict=True))


def assert_same_rows(actual: pa.Table, expected: pa.Table) -> None:
    """Same keys, same values, no duplicate in either; the message names what differs."""
    assert actual.num_rows == expected.num_rows, f"{actual.num_rows} rows, expected {expected.num_rows}"
    got, want = keyed(actual), keyed(expected)
    missing = sorted(want.keys() - got.keys())
    extra = sorted(got.keys() - want.keys())
    changed = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    assert not (missing or extra or changed), (
        f"missing {len(missing)} e.g. {missing[:3]}; extra {len(extra)} e.g. {extra[:3]}; "
        f"changed {len(changed)} e.g. {[(k, got[k], want[k]) for k in changed[:3]]}"
    )


def main_rows(lake: Lake) -> pa.Table:
    return canonical(lake.table(TABLE).to_arrow())


def main_snapshot_id(lake: Lake) -> int | None:
    snapshot = lake.table(TABLE).iceberg.current_snapshot()
    return snapshot.snapshot_id if snapshot else None


def main_history(lake: Lake) -> list[Any]:
    """Snapshots of main's lineage, oldest first."""
    iceberg = lake.table(TABLE).iceberg
    chain, snapshot = [], iceberg.current_snapshot()
    while snapshot is not None:
        chain.append(snapshot)
        snapshot = iceberg.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    return list(reversed(chain))


def publish_snapshots(lake: Lake, job_id: str) -> list[Any]:
    """This job's publish commits on main's lineage."""
    return [s for s in main_history(lake)
            if (s.summary or {}).get(JOB_PROPERTY) == job_id and (s.summary or {}).get(STEP_PROPERTY) == "publish"]


def refs(lake: Lake) -> set[str]:
    return set(lake.table(TABLE).iceberg.metadata.refs)


def run_cli(warehouse: Path, *args: str, crash_at: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """The installed `timelake` command in a fresh process, optionally armed to die at a crash point."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMELAKE_")}
    if crash_at:
        env["TIMELAKE_CRASH_AT"] = crash_at
    return subprocess.run([str(TIMELAKE), *args, "--warehouse", str(warehouse)], env=env, capture_output=True,
                          text=True, timeout=timeout)


def run_backfill(warehouse: Path, source: str, *extra: str, crash_at: str | None = None) -> subprocess.CompletedProcess:
    return run_cli(warehouse, "backfill", TABLE, "--from", source, "--max-concurrency", "1", "--json", *extra,
                   crash_at=crash_at)


def json_out(result: subprocess.CompletedProcess) -> Any:
    assert result.stdout.strip(), f"no output; exit {result.returncode}; stderr: {result.stderr[-2000:]}"
    return json.loads(result.stdout)


def day_of(ts_us: int) -> int:
    return ts_us // US_PER_DAY


def seeded(tmp_path: Path, days: int) -> tuple[Lake, Path, pa.Table, list[pa.Table], str]:
    """A lake whose table holds the original rows, and the export of the parts to backfill:
    (lake, warehouse, original rows, parts, source glob)."""
    lake, warehouse = make_lake(tmp_path)
    original = original_rows(days)
    create_table(lake).append(original)
    parts = source_parts(days)
    return lake, warehouse, original, parts, write_source(tmp_path / "export", parts)
